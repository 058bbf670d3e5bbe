"""Start the in-process vLLM replicas of a configuration before the pool.

Each ``kind: inprocess`` replica becomes an :class:`engine.backends.inprocess.InProcessEngine`
launched with its ``vllm`` arguments, plus what the gateway needs from it:
its served name, prompt-token details in ``usage`` (cached tokens), and a
KV-event publisher on local IPC sockets (vLLM binds ``ipc://`` endpoints and
only *connects* to a ``tcp://host:port`` one; IPC also keeps the stream off
the network) — written back into the replica's settings so the precise policy
follows its cache like any other replica's.
"""

from __future__ import annotations

import contextlib
import json
import tempfile

from engine.backends.inprocess import InProcessEngine
from gateway.config import KVEventSettings, ReplicaSettings, Settings


def _ipc_endpoints(replica_id: str) -> tuple[str, str]:
    folder = tempfile.mkdtemp(prefix=f"prefixgate-kv-{replica_id}-")
    return f"ipc://{folder}/pub", f"ipc://{folder}/replay"


def engine_args(replica_id: str, cfg: ReplicaSettings) -> tuple[list[str], KVEventSettings]:
    assert cfg.vllm is not None
    args = cfg.vllm.to_args()
    if cfg.model and cfg.vllm.served_model_name is None:
        args += ["--served-model-name", cfg.model]
    if "--enable-prompt-tokens-details" not in args:
        args.append("--enable-prompt-tokens-details")
    kv = cfg.kv_events
    if kv is None and "--kv-events-config" not in args:
        pub, replay = _ipc_endpoints(replica_id)
        kv = KVEventSettings(endpoint=pub, replay_endpoint=replay)
        args += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq", "topic": kv.topic,
            "endpoint": kv.endpoint, "replay_endpoint": kv.replay_endpoint})]
    assert kv is not None or "--kv-events-config" in args
    return args, kv if kv is not None else KVEventSettings(endpoint="")


async def start_inprocess(settings: Settings, stack: contextlib.AsyncExitStack
                          ) -> tuple[Settings, dict[str, InProcessEngine]]:
    """Start every in-process replica; returns settings with their KV endpoints filled in."""
    engines: dict[str, InProcessEngine] = {}
    replicas: list[ReplicaSettings] = []
    for replica_id, cfg in zip(settings.replica_ids(), settings.replicas):
        if cfg.kind != "inprocess":
            replicas.append(cfg)
            continue
        args, kv = engine_args(replica_id, cfg)
        engine = InProcessEngine(replica_id, args)
        await engine.start()
        stack.push_async_callback(engine.aclose)
        engines[replica_id] = engine
        replicas.append(cfg.model_copy(update={
            "id": replica_id, "kv_events": kv if kv.endpoint else cfg.kv_events}))
    if not engines:
        return settings, engines
    return settings.model_copy(update={"replicas": replicas}), engines
