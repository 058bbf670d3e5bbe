"""Start and stop the emulation server from the gateway's venv (which has no torch).

The server runs under the vLLM-on-CPU venv's interpreter (torch and
transformers are there), found by :class:`engine.vllm.local.VllmCpuSetup`.
That interpreter must import this repository's ``engine`` package but none
of the gateway venv's other packages, so ``PYTHONPATH`` points at a temporary
folder holding only a link to ``engine``. The process gets its own process
group; :meth:`EmulationServer.stop` sends SIGTERM to the group, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.spawning import held_exit, stop_groups
from engine.vllm.local import ReplicaStartError, VllmCpuSetup, pick_ports

ENGINE_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class EmulationSpec:
    model: str = "smollm2-135m-instruct"
    """A model folder under the vLLM-on-CPU setup's models dir (it needs real weights)."""
    served_name: str = "smollm2"
    threads: int | None = None


@dataclass
class EmulationServer:
    spec: EmulationSpec
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    path_dir: Path

    def model(self, mode: str) -> str:
        """The served name of one KV mode (``auto``, ``fp8``, ``int8``, ``int2``)."""
        return f"{self.spec.served_name}:kv-{mode}"

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise ReplicaStartError(f"KV emulation server exited with "
                                            f"{self.process.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise ReplicaStartError(f"KV emulation server not healthy after "
                                            f"{timeout:.0f}s:\n{self.log_tail()}")
                time.sleep(0.3)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 10.0) -> None:
        stop_groups([self.process], grace)
        with contextlib.suppress(OSError):
            (self.path_dir / "engine").unlink()
            self.path_dir.rmdir()


def launch(spec: EmulationSpec, setup: VllmCpuSetup | None = None, log_dir: Path | None = None,
           rng: random.Random | None = None) -> EmulationServer:
    """Spawn the server (returns at once); ``wait_ready`` before using it."""
    setup = setup or VllmCpuSetup.locate()
    reason = setup.missing_reason()
    if reason:
        raise ReplicaStartError(reason)
    model_dir = setup.model_path(spec.model)
    if not any(model_dir.glob("*.safetensors")):
        raise ReplicaStartError(f"{model_dir} has no weights: the emulation needs a real model")
    (port,) = pick_ports(1, rng or random.Random())
    path_dir = Path(tempfile.mkdtemp(prefix="prefixgate-kvemu-path-"))
    (path_dir / "engine").symlink_to(ENGINE_DIR, target_is_directory=True)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="prefixgate-kvemu-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "kv-emulation.log"
    args = [str(setup.python), "-m", "engine.vllm.kv_emulation.server", "--model", str(model_dir),
            "--served-model-name", spec.served_name, "--port", str(port)]
    if spec.threads:
        args += ["--threads", str(spec.threads)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PYTHONPATH=str(path_dir), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, cwd=log_dir,
                                   start_new_session=True)
    return EmulationServer(spec, f"http://127.0.0.1:{port}", process, log_path, path_dir)


@contextlib.contextmanager
def running_emulation(spec: EmulationSpec | None = None, setup: VllmCpuSetup | None = None,
                      log_dir: Path | None = None, timeout: float = 180.0
                      ) -> Iterator[EmulationServer]:
    """``with running_emulation() as emu: emu.base_url, emu.model("fp8")`` -- stopped on exit."""
    server: EmulationServer | None = None
    try:
        with held_exit():  # a SIGTERM's exit waits until the server is held
            server = launch(spec or EmulationSpec(), setup, log_dir)
        server.wait_ready(timeout)
        yield server
    finally:
        if server is not None:
            server.stop()
