"""The simulated vLLM replicas a benchmark runs against (``python -m engine.sim``).

All replicas get the same ``--seed``: the simulator's answer text is drawn
from the server seed and the prompt, so with one seed every replica answers
a given prompt with the same words. A multi-turn conversation therefore
builds the same history whichever replica a router picks, and every
contender replays exactly the same prompts.

Between contenders the caches are emptied with vLLM's
``POST /reset_prefix_cache?reset_running_requests=true`` on each replica
(the runs have drained by then) instead of restarting the processes, which
saves the tokenizer load per replica.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.tokenizer import bundled_qwen_tokenizer_dir
from loadtest.processes import Service, ServiceGroup, free_port


@dataclass(frozen=True)
class SimFleetSpec:
    count: int = 4
    model: str = "sim-model"
    tokenizer: str | None = None
    """Tokenizer folder; ``None``: the bundled Qwen3 tokenizer."""
    block_size: int = 16
    num_blocks: int = 1024
    max_model_len: int | None = None
    time_scale: float = 10.0
    seed: int = 0
    kv_events: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def tokenizer_path(self) -> str | None:
        return self.tokenizer or bundled_qwen_tokenizer_dir()


@dataclass(frozen=True, slots=True)
class SimReplica:
    id: str
    url: str
    num_blocks: int
    block_size: int
    kv_events_port: int | None = None
    kv_replay_port: int | None = None


def start_sims(spec: SimFleetSpec, group: ServiceGroup, log_dir: Path) -> list[SimReplica]:
    """Start ``spec.count`` replicas in parallel; they stop with ``group``."""
    tokenizer = spec.tokenizer_path()
    max_len = spec.max_model_len or min(8192, spec.num_blocks * spec.block_size)
    replicas, services = [], []
    for index in range(spec.count):
        port = free_port()
        argv = [sys.executable, "-m", "engine.sim", "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", spec.model, "--block-size", str(spec.block_size),
                "--num-blocks", str(spec.num_blocks), "--max-model-len", str(max_len),
                "--time-scale", str(spec.time_scale), "--seed", str(spec.seed),
                "--log-level", "warning"]
        if tokenizer:
            argv += ["--tokenizer", tokenizer]
        events = replay = None
        if spec.kv_events:
            events, replay = free_port(), free_port()
            argv += ["--kv-events-port", str(events), "--kv-events-replay-port", str(replay)]
        argv += list(spec.extra_args)
        url = f"http://127.0.0.1:{port}"
        services.append(Service(f"sim{index}", argv, url + "/health",
                                log_dir / f"sim{index}.log", env={"HF_HUB_OFFLINE": "1"}))
        replicas.append(SimReplica(f"sim{index}", url, spec.num_blocks, spec.block_size,
                                   events, replay))
    group.start_all(services, timeout=120.0)
    return replicas


def reset_caches(replicas: list[SimReplica]) -> None:
    """Empty every replica's prefix cache (vLLM's dev endpoint)."""
    with httpx.Client(timeout=10.0) as client:
        for replica in replicas:
            response = client.post(replica.url + "/reset_prefix_cache",
                                   params={"reset_running_requests": "true"})
            response.raise_for_status()
