"""Real vLLM-on-CPU replicas for ``python -m loadtest compare --replicas vllm-cpu:N``.

The servers come from :mod:`engine.vllm.local` (the venv and model folders
that ``deploy/vllm-cpu/setup.sh`` caches): ``--vllm-model`` names the model
folder, ``--vllm-blocks`` is each replica's ``--num-gpu-blocks-override``
(KV blocks of 32 tokens; choose it so that all replicas together hold the
workload's working set and one replica does not, otherwise placement does
not matter), ``--replica-args`` adds vLLM flags. Each replica is pinned to a
core of its own, publishes KV events and runs with ``VLLM_SERVER_DEV_MODE=1``
so that ``POST /reset_prefix_cache`` exists.

Contenders see a replica as a :class:`loadtest.sims.SimReplica`
(:func:`contender_replica`: id, URL, block size, KV-event ports). The
prefixgate contender gets the model folder as its tokenizer, and the ideal
bound replays the prompts with that folder, block size 32 and N x blocks.

Emptying the caches between contenders (:func:`reset_and_verify`), per
replica: a short probe prompt is served (so it is cached), the cache is
reset, the probe is sent again and ``vllm:prefix_cache_hits_total`` must not
grow, then the cache is reset once more. vLLM answers ``{"success": false}``
while blocks are still held, so a refused reset is retried for a few
seconds. A replica whose reset does not verify is restarted on the same
ports (a new process starts with an empty cache), so the next contender
still starts cold either way.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.vllm.local import (
    SETUP_STAMP_TEXT,
    LaunchSpec,
    LocalReplica,
    ReplicaInfo,
    VllmCpuSetup,
    running_replicas,
)
from loadtest.fleet import StartedFleet
from loadtest.replica_metrics import ReplicaCounters, parse_counters
from loadtest.sims import SimReplica
from loadtest.workloads.text import words

VLLM_CPU_MODELS = ("qwen2-tiny", "qwen2-small", "smollm2-135m-instruct")
CONTENDER_KV_TOPIC = "kv"
"""The topic :mod:`.contenders` subscribes to."""
PROBE_WORDS = 160
"""About five 32-token blocks: four can hit when the probe is repeated."""
RESET_ATTEMPTS = 20
RESET_RETRY_SECONDS = 0.5
COUNTER_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class VllmCpuFleet:
    """:class:`loadtest.fleet.Fleet` over ``count`` real vLLM-on-CPU replicas."""

    count: int
    model: str = "qwen2-small"
    num_blocks: int = 320
    """Per replica (``--num-gpu-blocks-override``); vLLM keeps one as its null block."""
    max_model_len: int | None = None
    """Default: 4096, or less when the blocks hold less."""
    extra_args: tuple[str, ...] = ()
    block_size: int = 32

    def replica_spec(self) -> LaunchSpec:
        fits = (self.num_blocks - 1) * self.block_size
        return LaunchSpec(
            model=self.model, max_model_len=self.max_model_len or min(4096, fits),
            block_size=self.block_size, num_gpu_blocks_override=self.num_blocks,
            kv_events=True, kv_topic=CONTENDER_KV_TOPIC, extra_args=self.extra_args,
            extra_env=(("VLLM_SERVER_DEV_MODE", "1"),))

    def capacity_blocks(self) -> int:
        return self.num_blocks * self.count

    def tokenizer_path(self) -> str:
        return str(VllmCpuSetup.locate().model_path(self.model))

    def with_kv_events(self) -> VllmCpuFleet:
        return self  # always on: the replicas publish KV events whatever the contenders

    def start(self, stack: contextlib.ExitStack[bool | None], log_dir: Path) -> StartedFleet:
        setup = VllmCpuSetup.locate()
        missing = setup.missing_reason()
        if missing:
            raise FileNotFoundError(missing)
        spec = self.replica_spec()
        spec.check()
        print(f"== starting {self.count} vLLM-on-CPU replicas ({self.model})", file=sys.stderr,
              flush=True)
        running = stack.enter_context(
            running_replicas([spec] * self.count, setup=setup, log_dir=log_dir))
        replicas = tuple(contender_replica(r.info, self.num_blocks) for r in running)
        return StartedFleet(replicas, lambda: reset_and_verify(running))

    def label(self) -> str:
        return f"{self.count} vLLM-on-CPU {self.model} replicas"

    def describe(self) -> dict[str, object]:
        spec = self.replica_spec()
        return {"kind": "vllm-cpu", "count": self.count, "model": self.model,
                "num_blocks": self.num_blocks, "block_size": self.block_size,
                "max_model_len": spec.max_model_len, "extra_args": list(self.extra_args),
                "tokenizer": self.tokenizer_path(), "engine": SETUP_STAMP_TEXT,
                "cores": "one per replica (taskset, VLLM_CPU_OMP_THREADS_BIND)",
                "reset": "POST /reset_prefix_cache, verified with a repeated probe prompt"}


def endpoint_port(endpoint: str | None) -> int | None:
    """``tcp://127.0.0.1:5557`` -> 5557."""
    return None if endpoint is None else int(endpoint.rsplit(":", 1)[1])


def contender_replica(info: ReplicaInfo, num_blocks: int) -> SimReplica:
    """A real replica as the contenders see one (they connect to 127.0.0.1:<port>, topic kv)."""
    if info.kv_events_endpoint is not None and info.kv_topic != CONTENDER_KV_TOPIC:
        raise ValueError(f"contenders subscribe to topic {CONTENDER_KV_TOPIC!r}, "
                         f"replica {info.replica_id} publishes {info.kv_topic!r}")
    return SimReplica(info.replica_id, info.base_url, num_blocks, info.block_size,
                      endpoint_port(info.kv_events_endpoint),
                      endpoint_port(info.kv_replay_endpoint))


def _counters(client: httpx.Client, url: str) -> ReplicaCounters:
    response = client.get(url + "/metrics")
    response.raise_for_status()
    return parse_counters(response.text)


def _probe(client: httpx.Client, replica: ReplicaInfo) -> int:
    """Serve the probe prompt once; returns the prompt tokens it found cached."""
    url = replica.base_url
    before = _counters(client, url)
    response = client.post(url + "/v1/completions", json={
        "model": replica.model, "prompt": words("loadtest/reset-probe", PROBE_WORDS),
        "max_tokens": 1, "temperature": 0.0})
    response.raise_for_status()
    deadline = time.monotonic() + COUNTER_WAIT_SECONDS
    after = _counters(client, url)
    while after.prefix_queries <= before.prefix_queries and time.monotonic() < deadline:
        time.sleep(0.05)  # the counters of the request may land just after its response
        after = _counters(client, url)
    return round(after.prefix_hits - before.prefix_hits)


def _reset(client: httpx.Client, url: str) -> bool:
    for _ in range(RESET_ATTEMPTS):
        response = client.post(url + "/reset_prefix_cache",
                               params={"reset_running_requests": "true"})
        response.raise_for_status()
        if response.json().get("success", False):
            return True
        time.sleep(RESET_RETRY_SECONDS)  # blocks still held: vLLM asks callers to retry
    return False


def reset_verified(client: httpx.Client, replica: ReplicaInfo) -> bool:
    """Reset the replica's cache and check that a prompt cached before no longer hits."""
    url = replica.base_url
    _probe(client, replica)
    if not _reset(client, url):
        return False
    if _probe(client, replica) > 0:
        return False
    return _reset(client, url)


def reset_and_verify(replicas: Sequence[LocalReplica]) -> None:
    """Empty every replica's prefix cache; restart a replica whose reset does not verify."""
    with httpx.Client(timeout=60.0) as client:
        for replica in replicas:
            rid = replica.info.replica_id
            if reset_verified(client, replica.info):
                print(f"   reset {rid}: verified (repeated probe: 0 cached tokens)",
                      file=sys.stderr, flush=True)
                continue
            print(f"   reset {rid}: did not empty the cache, restarting it", file=sys.stderr,
                  flush=True)
            replica.stop()
            replica.restart()
            replica.wait_ready()
