"""The servers a calibration probes: a real vLLM-on-CPU replica, a simulator, or a URL.

Each is a context manager yielding a :class:`Target` (where it listens and
what it is) and stopping what it started on exit.

* :func:`vllm_target` starts one replica of ``engine.vllm.local`` pinned to
  one core, with the scheduler limits of :class:`EngineLimits` passed
  explicitly (they are vLLM's CPU defaults for the API server, written out so
  the simulator can be given the same ones), prefix caching on and KV events
  off (the calibration measures the engine, not the event publisher).
* :func:`sim_target` starts ``python -m engine.sim`` at ``--time-scale 1``
  with the same limits, block size and tokenizer, and the latency
  parameters under test; under ``taskset`` on the same core when available,
  so simulator and engine see the same CPU.
* :func:`url_target` wraps a server someone else runs (the model name is
  read from ``/v1/models`` unless given).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.vllm.local import LaunchSpec, running_replicas
from loadtest.calibration.model import LatencyParams
from loadtest.processes import Service, ServiceGroup, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class EngineLimits:
    block_size: int = 32
    max_model_len: int = 2048
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    sim_num_blocks: int = 4096
    """The simulator's KV capacity; vLLM's comes from ``VLLM_CPU_KVCACHE_SPACE``."""


@dataclass(frozen=True, slots=True)
class Target:
    base_url: str
    model: str
    kind: str
    """``vllm``, ``sim`` or ``url``."""
    details: dict[str, str] = field(default_factory=dict)
    core: int | None = None
    """The core it is pinned to, when we pinned it."""
    process_group: int | None = None
    """Its process group, when we started it (for ``calibration.cpu``)."""


@contextlib.contextmanager
def vllm_target(model: str, limits: EngineLimits, core: int) -> Iterator[Target]:
    log_dir = Path(tempfile.mkdtemp(prefix="prefixgate-calibrate-"))
    spec = LaunchSpec(
        model=model,
        max_model_len=limits.max_model_len,
        block_size=limits.block_size,
        kv_events=False,
        core=core,
        extra_args=(
            "--max-num-seqs", str(limits.max_num_seqs),
            "--max-num-batched-tokens", str(limits.max_num_batched_tokens),
        ),
    )  # fmt: skip
    with running_replicas([spec], log_dir=log_dir) as replicas:
        replica = replicas[0]
        yield Target(
            base_url=replica.info.base_url,
            model=replica.info.model,
            kind="vllm",
            details={
                "model_folder": model,
                "core": str(replica.info.core),
                "start_seconds": f"{replica.start_seconds or 0.0:.1f}",
                "log": str(replica.info.log_path),
                "command": " ".join(replica.command),
            },
            core=replica.info.core,
            process_group=replica.info.pid,  # launched with start_new_session
        )


def sim_argv(
    port: int, model: str, tokenizer: str, limits: EngineLimits, params: LatencyParams,
    core: int | None,
) -> list[str]:
    argv = [
        sys.executable, "-m", "engine.sim", "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", model, "--tokenizer", tokenizer,
        "--block-size", str(limits.block_size), "--num-blocks", str(limits.sim_num_blocks),
        "--max-model-len", str(limits.max_model_len),
        "--max-num-seqs", str(limits.max_num_seqs),
        "--max-num-batched-tokens", str(limits.max_num_batched_tokens),
        "--time-scale", "1", "--log-level", "warning", *params.sim_flags(),
    ]  # fmt: skip
    if core is not None and shutil.which("taskset"):
        argv = ["taskset", "-c", str(core), *argv]
    return argv


@contextlib.contextmanager
def sim_target(
    model: str,
    tokenizer: str,
    limits: EngineLimits,
    params: LatencyParams,
    core: int | None,
    log_dir: Path,
) -> Iterator[Target]:
    port = free_port()
    argv = sim_argv(port, model, tokenizer, limits, params, core)
    url = f"http://127.0.0.1:{port}"
    service = Service(f"sim-{port}", argv, url + "/health", log_dir / f"sim-{port}.log",
                      env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)},
                      cwd=str(REPO_ROOT))
    with ServiceGroup() as group:
        group.start(service, timeout=120.0)
        assert service.process is not None
        yield Target(url, model, "sim", {"flags": params.flag_text(), "command": " ".join(argv)},
                     core=core, process_group=service.process.pid)


@contextlib.contextmanager
def url_target(base_url: str, model: str | None) -> Iterator[Target]:
    base_url = base_url.rstrip("/").removesuffix("/v1")
    if model is None:
        response = httpx.get(f"{base_url}/v1/models", timeout=10.0)
        response.raise_for_status()
        model = str(response.json()["data"][0]["id"])
    yield Target(base_url, model, "url")
