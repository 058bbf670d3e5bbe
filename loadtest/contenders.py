"""The routers a comparison puts in front of the same replicas, and how to start each.

Contender names are ``kind:variant``:

* ``prefixgate:<policy>[?option=value&...]``: ``python -m gateway.cli serve --config FILE`` with
  the replicas, the model and its tokenizer (the one the sims use) and that
  policy; ``prefixgate:default`` leaves the policy unset. Options are the
  policy's; ``@setting=value`` sets a gateway setting (``@lint={enabled: false}``)
  and ``@tree=DIR`` runs another checkout (see :func:`variant_options`). ``precise`` also
  needs each replica's KV-event endpoints in the replica settings
  (``kv_events: {endpoint, replay_endpoint, topic}``); when the gateway's
  settings have no such key, or the sims publish no events, the contender is
  reported unavailable;
* ``prefixgate-bytes:<policy>[?...]``: the same gateway given no tokenizer, as a
  user who passes only ``--replica`` URLs; with replicas whose ``/v1/models``
  root is not a local folder (``--replica-args "--model-root /elsewhere"``)
  it falls back to the byte renderer, which the row then measures;
* ``vllm-router:<policy>`` and ``sglang-router:<policy>``: the peers (see
  :mod:`.peers`), installed on first use; ``vllm-router:kv_aware`` is fed the
  sims' KV events like ``prefixgate:precise``;
* ``prefixgate-2:<policy>`` and ``prefixgate-2-redis:<policy>``: two gateway
  instances with the requests split between them (each in turn: see
  :mod:`.split_client`), on their own or sharing routing state through Redis
  (``LOADTEST_REDIS_URL``, default ``redis://127.0.0.1:6379/0``, a key prefix
  per run);
* ``direct:sim0``: no router, the client talks to the first replica: the
  floor for overhead (and one replica's capacity and cache, not four).

:func:`launch` starts one contender and returns its base URL; every process
it starts belongs to the ``ServiceGroup`` passed in, so leaving the group's
``with`` block stops it. Failures raise :class:`ContenderUnavailable` with
the reason and the child's log tail.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.config import ReplicaSettings, Settings
from loadtest.peer_ready import PeerNotReady, wait_all_workers
from loadtest.peers import (
    SGLANG_ROUTER,
    VLLM_ROUTER,
    PeerUnavailable,
    ensure_installed,
    sglang_router_argv,
    vllm_router_argv,
)
from loadtest.processes import Service, ServiceGroup, StartError, free_port
from loadtest.sims import SimReplica

PREFIXGATE_POLICIES = ("round_robin", "least_load", "chwbl", "prefix", "precise")
VLLM_ROUTER_POLICIES = ("cache_aware", "kv_aware", "consistent_hash", "round_robin")
NEEDS_KV_EVENTS = ("prefixgate:precise", "prefixgate:default", "vllm-router:kv_aware")
SGLANG_ROUTER_POLICIES = ("cache_aware",)
GATEWAY_FLEETS = {"prefixgate-2": False, "prefixgate-2-redis": True}
"""Two gateway instances with the load split between them: sharing routing state
through Redis (``LOADTEST_REDIS_URL``, default the local one) or each on its own."""


class ContenderUnavailable(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class ContenderSpec:
    kind: str
    variant: str

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.variant}"

    def needs_kv_events(self) -> bool:
        return self.name.partition("?")[0] in NEEDS_KV_EVENTS

    @classmethod
    def parse(cls, text: str) -> ContenderSpec:
        kind, sep, variant = text.partition(":")
        if not sep or kind not in ("prefixgate", "prefixgate-bytes", "vllm-router",
                                   "sglang-router", "direct", *GATEWAY_FLEETS):
            raise ValueError(f"bad contender {text!r}: expected prefixgate:POLICY, "
                             "prefixgate-bytes:POLICY, prefixgate-2:POLICY, "
                             "prefixgate-2-redis:POLICY, vllm-router:POLICY, "
                             "sglang-router:POLICY or direct:sim0")
        return cls(kind, variant)


def default_policy() -> str:
    return str(Settings.model_fields["policy"].default)


def all_contenders() -> list[ContenderSpec]:
    """Every contender, prefixgate's default policy folded into its own row."""
    specs = [ContenderSpec("prefixgate", p) for p in PREFIXGATE_POLICIES]
    if default_policy() not in PREFIXGATE_POLICIES:
        specs.append(ContenderSpec("prefixgate", "default"))
    specs += [ContenderSpec("vllm-router", p) for p in VLLM_ROUTER_POLICIES]
    specs += [ContenderSpec("sglang-router", p) for p in SGLANG_ROUTER_POLICIES]
    specs.append(ContenderSpec("direct", "sim0"))
    return specs


def kv_events_key() -> str | None:
    """The replica-settings key for a KV-event endpoint, if the gateway has one."""
    for name in ReplicaSettings.model_fields:
        if "event" in name:
            return name
    return None


def _gateway(spec: ContenderSpec, replicas: Sequence[SimReplica], model: str,
             tokenizer: str | None, group: ServiceGroup, log_dir: Path,
             instances: int = 1, redis_url: str | None = None) -> str:
    entries = []
    events_key = kv_events_key()
    if spec.needs_kv_events():
        if events_key is None:
            raise ContenderUnavailable(
                "the gateway's replica settings have no KV-event endpoint key yet; "
                "precise needs one to learn the replicas' caches")
        if any(r.kv_events_port is None for r in replicas):
            raise ContenderUnavailable("the replicas were started without KV events")
    for replica in replicas:
        entry: dict[str, object] = {"id": replica.id, "url": replica.url, "model": model,
                                    "block_size": replica.block_size}
        if spec.needs_kv_events() and events_key:
            entry[events_key] = {
                "endpoint": f"tcp://127.0.0.1:{replica.kv_events_port}",
                "replay_endpoint": f"tcp://127.0.0.1:{replica.kv_replay_port}",
                "topic": "kv",
            }
        entries.append(entry)
    settings: dict[str, object] = {"host": "127.0.0.1", "replicas": entries,
                                   "models": [{"name": model, "tokenizer": tokenizer}
                                              if tokenizer else {"name": model}],
                                   "log_level": "warning"}
    if redis_url is not None:  # a key prefix of this run's own
        settings.update(redis_url=redis_url,
                        redis_key_prefix=f"prefixgate-bench-{secrets.token_hex(4)}:")
    policy, _, query = spec.variant.partition("?")
    if policy != "default":
        settings["policy"] = policy
    options, gateway_settings, tree = variant_options(query)
    if options:
        settings["policy_options"] = options
    settings.update(gateway_settings)
    env = {"HF_HUB_OFFLINE": "1"}
    if tree is not None:  # another checkout of prefixgate, e.g. the commit before a change
        # what the benchmark itself puts there (loadtest.sections' harness) goes on after it
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))
    urls = []
    for index in range(instances):
        port = free_port()
        stem = spec.name.replace(":", "-") + (f"-{index}" if instances > 1 else "")
        config = log_dir / f"{stem}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump({**settings, "port": port}))
        urls.append(f"http://127.0.0.1:{port}")
        group.start(Service(stem, [sys.executable, "-m", "gateway.cli", "serve", "--config",
                                   str(config.resolve())],  # a tree's gateway runs there
                            urls[-1] + "/ready", log_dir / f"{stem}.log",
                            env=env, cwd=tree), timeout=120.0)
    return ",".join(urls)


def variant_options(query: str) -> tuple[dict[str, object], dict[str, object], str | None]:
    """A prefixgate variant's ``?`` part: policy options, gateway settings, another tree.

    ``prefix?scorer=threshold&running_request_seconds=0.002`` sets policy options;
    a key starting with ``@`` sets a gateway setting instead (``@lint={enabled: false}``,
    values in YAML); ``@tree=DIR`` runs the gateway from another checkout of prefixgate
    (the commit before a change, side by side with this one).
    """
    options: dict[str, object] = {}
    settings: dict[str, object] = {}
    tree: str | None = None
    for key, _, value in (item.partition("=") for item in query.split("&") if item):
        if key == "@tree":
            tree = str(Path(value).resolve())
        elif key.startswith("@"):
            settings[key[1:]] = yaml.safe_load(value)
        else:
            options[key] = yaml.safe_load(value)
    return options, settings, tree


def kv_event_args(replicas: Sequence[SimReplica], model: str) -> list[str]:
    """vllm-router's static KV-event sources, one per worker."""
    args: list[str] = []
    for replica in replicas:
        args += ["--kv-event-source", f"{replica.url}=tcp://127.0.0.1:{replica.kv_events_port}",
                 "--kv-event-replay-source",
                 f"{replica.url}=tcp://127.0.0.1:{replica.kv_replay_port}"]
    block_size = replicas[0].block_size if replicas else 16
    return args + ["--kv-event-block-size", str(block_size), "--kv-event-model", model]


def _peer(spec: ContenderSpec, replicas: Sequence[SimReplica], model: str,
          group: ServiceGroup, log_dir: Path) -> str:
    package = VLLM_ROUTER if spec.kind == "vllm-router" else SGLANG_ROUTER
    try:
        venv = ensure_installed(package)
    except PeerUnavailable as exc:
        raise ContenderUnavailable(str(exc)) from None
    port, metrics_port = free_port(), free_port()
    workers = [r.url for r in replicas]
    build = vllm_router_argv if spec.kind == "vllm-router" else sglang_router_argv
    argv = build(venv, port, metrics_port, workers, spec.variant)
    if spec.needs_kv_events():
        if any(r.kv_events_port is None for r in replicas):
            raise ContenderUnavailable("the replicas were started without KV events")
        argv += kv_event_args(replicas, model)
    url = f"http://127.0.0.1:{port}"
    group.start(Service(spec.name, argv, url + "/health",
                        log_dir / f"{spec.name.replace(':', '-')}.log"), timeout=90.0)
    try:  # /health is 200 before the workers are registered: see peer_ready
        wait_all_workers(url, len(workers))
    except PeerNotReady as exc:
        raise ContenderUnavailable(str(exc)) from None
    return url


def launch(spec: ContenderSpec, replicas: Sequence[SimReplica], model: str,
           tokenizer: str | None, group: ServiceGroup, log_dir: Path) -> str:
    """Start the contender in front of ``replicas``; returns the URL to send to."""
    try:
        if spec.kind == "direct":
            matching = [r for r in replicas if r.id == spec.variant]
            if not matching:
                raise ContenderUnavailable(f"no replica {spec.variant!r}")
            return matching[0].url
        if spec.kind == "prefixgate":
            return _gateway(spec, replicas, model, tokenizer, group, log_dir)
        if spec.kind == "prefixgate-bytes":
            return _gateway(spec, replicas, model, None, group, log_dir)
        if spec.kind in GATEWAY_FLEETS:
            redis_url = (os.environ.get("LOADTEST_REDIS_URL", "redis://127.0.0.1:6379/0")
                         if GATEWAY_FLEETS[spec.kind] else None)
            return _gateway(spec, replicas, model, tokenizer, group, log_dir, instances=2,
                            redis_url=redis_url)
        return _peer(spec, replicas, model, group, log_dir)
    except StartError as exc:
        raise ContenderUnavailable(str(exc)) from None
