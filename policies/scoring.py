"""Scoring rules shared by the cache-aware policies (``prefix``, ``precise``).

A cache-aware policy first asks its index how many leading blocks of the
prompt each healthy replica holds (``matched``), then one of two rules, chosen
with the option ``scorer``, turns that and the replicas' load into a ranking.

``cost`` (default): estimated time to first token, lowest wins::

    ttft(r) = running(r) * running_request_seconds
            + waiting(r) * waiting_request_seconds
            + uncached_tokens(r) * prefill_seconds_per_token
            + kv_pressure(r) * kv_pressure_seconds
            - session_affinity_seconds   (only the session's last replica)

  ``uncached_tokens = prompt_tokens - matched(r) * block_size``: what the
  replica must prefill. ``waiting`` is the engine's queue: each waiting
  request is prefilled before ours. ``running`` is the rest of the
  replica's outstanding work, ``max(inflight, running + waiting) - waiting``
  (the gateway's own in-flight count is fresher than the last scrape, so a
  burst raises the cost at once); each running request slows the shared
  engine steps a little. ``kv_pressure`` rises linearly from 0 at
  ``kv_pressure_threshold`` KV usage to 1 at full: a nearly full cache makes
  the engine queue, preempt and evict. The trade-off is explicit: with the
  defaults a cached 1,000-token prefix is worth 50 more running requests or
  one more waiting request. Equal costs are broken by a rotating offset, so
  identical replicas share load instead of the first id taking it all.

``threshold`` (sgl-router / vllm-router ``cache_aware`` style):

  1. Load is *imbalanced* when ``max - min > balance_abs_threshold`` and
     ``max > balance_rel_threshold * min`` over the healthy replicas' load:
     route to the least loaded (``load-fallback``).
  2. Otherwise, if the best match covers more than ``cache_threshold`` of the
     prompt's tokens, route to the best-matching replica (``hit``; ties go to
     the less loaded).
  3. Otherwise, to the session's last replica if affinity is on (``session``),
     else to the least loaded (``miss``). sgl-router sends misses to the
     replica with the smallest tree; we use least load, which is what the
     tree size approximates.

Session affinity (``session_affinity``, off by default): a request carrying a
``session_key`` prefers the replica that served the session last. In
``cost`` it is a discount of ``session_affinity_seconds``, so a replica whose
queue is that much worse than another's still loses; in ``threshold`` it only
replaces the ``miss`` choice. Unhealthy replicas are never candidates.

Decision reasons: ``hit`` (chosen replica holds the best match), ``miss`` (no
replica holds any of the prompt), ``load-fallback`` (a better match was
passed over for load), ``session`` (affinity decided). Decision scores are
the estimated TTFT in seconds for ``cost`` and the matched fraction of the
prompt for ``threshold``. Fallbacks are the other healthy replicas, best
first.

Parameters (all options of ``prefix`` and ``precise``):

* ``scorer`` (default ``"cost"``): ``"cost"`` or ``"threshold"``.
* ``prefill_seconds_per_token`` (default 0.0001): prefill time per uncached
  token, i.e. 10k tokens/s.
* ``running_request_seconds`` (default 0.002): TTFT added per running request.
  A running request slows each engine step by about one decode slot (a few
  milliseconds at most on a GPU, 0.2 ms in the simulator's default model); it
  does not delay our prefill the way a *waiting* request does. With 0.01 the
  side-by-side shared-prefix benchmark lost 3.5 points of hit rate and had a
  worse TTFT p99 than with 0.002 (BENCHMARKS.md): affinity was given up for
  load differences that cost less than the prefill it caused.
* ``waiting_request_seconds`` (default 0.1): TTFT added per waiting request
  (about the prefill of a 1,000-token prompt).
* ``kv_pressure_threshold`` (default 0.9): KV usage where pressure starts.
* ``kv_pressure_seconds`` (default 1.0): TTFT added at 100% KV usage.
* ``cache_threshold`` (default 0.5): ``threshold`` scorer's hit ratio.
* ``balance_abs_threshold`` (default 64): ``threshold`` imbalance, absolute.
* ``balance_rel_threshold`` (default 1.5): ``threshold`` imbalance, relative.
* ``session_affinity`` (default false): prefer a session's last replica.
* ``session_affinity_seconds`` (default 0.02): the ``cost`` discount, about
  200 tokens of prefill: a tie-breaker. The index already sends a turn to
  the replica holding its history; in replays of multi-turn chats a large
  discount (0.25) cost 11 points of hit rate by pinning sessions to replicas
  whose copy of the history was evicted. Affinity earns its keep where the
  index is blind: after a gateway restart, across gateway instances, or for
  salted requests in ``precise`` mode.
* ``session_ttl_seconds`` (default 600.0): a session idle this long is new.
* ``max_sessions`` (default 100_000): remembered sessions, LRU beyond.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .base import healthy
from .types import Decision, ReplicaView, RouteRequest

SCORERS = ("cost", "threshold")


@dataclass(frozen=True)
class ScoringConfig:
    scorer: str = "cost"
    prefill_seconds_per_token: float = 0.0001
    running_request_seconds: float = 0.002
    waiting_request_seconds: float = 0.1
    kv_pressure_threshold: float = 0.9
    kv_pressure_seconds: float = 1.0
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    session_affinity: bool = False
    session_affinity_seconds: float = 0.02
    session_ttl_seconds: float = 600.0
    max_sessions: int = 100_000

    def __post_init__(self) -> None:
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {', '.join(SCORERS)}, not {self.scorer!r}")
        non_negative = {
            "prefill_seconds_per_token": self.prefill_seconds_per_token,
            "running_request_seconds": self.running_request_seconds,
            "waiting_request_seconds": self.waiting_request_seconds,
            "kv_pressure_seconds": self.kv_pressure_seconds,
            "balance_abs_threshold": self.balance_abs_threshold,
            "session_affinity_seconds": self.session_affinity_seconds,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"{name} must not be negative")
        if not 0.0 <= self.kv_pressure_threshold < 1.0:
            raise ValueError("kv_pressure_threshold must be in [0, 1)")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if self.balance_rel_threshold < 1.0:
            raise ValueError("balance_rel_threshold must be at least 1")
        if self.session_ttl_seconds <= 0 or self.max_sessions <= 0:
            raise ValueError("session_ttl_seconds and max_sessions must be positive")


def prompt_token_count(request: RouteRequest) -> int:
    """Prompt length, from the hashes when the gateway did not say."""
    return request.prompt_tokens or len(request.block_hashes) * request.block_size


def estimated_ttft(
    replica: ReplicaView, matched_blocks: int, request: RouteRequest, config: ScoringConfig
) -> float:
    """The ``cost`` rule without the session discount, in seconds."""
    prompt_tokens = prompt_token_count(request)
    cached_tokens = min(prompt_tokens, matched_blocks * request.block_size)
    prefill = (prompt_tokens - cached_tokens) * config.prefill_seconds_per_token
    queue = (replica.running_load * config.running_request_seconds
             + replica.waiting * config.waiting_request_seconds)
    headroom = 1.0 - config.kv_pressure_threshold
    pressure = max(0.0, min(1.0, (replica.kv_usage - config.kv_pressure_threshold) / headroom))
    return queue + prefill + pressure * config.kv_pressure_seconds


def decide(
    request: RouteRequest,
    replicas: Sequence[ReplicaView],
    matched_by_replica: Mapping[str, int],
    session_replica: str | None,
    config: ScoringConfig,
    rotation: int,
) -> Decision:
    """Rank the healthy replicas with the configured rule.

    ``rotation`` is the caller's request counter: it breaks ties so that
    equal replicas take turns. Raises ``NoReplicaAvailable``.
    """
    candidates = sorted(healthy(replicas), key=lambda r: r.id)
    matched = {r.id: matched_by_replica.get(r.id, 0) for r in candidates}
    if session_replica not in matched or not config.session_affinity:
        session_replica = None
    offset = rotation % len(candidates)
    turn = {r.id: (i - offset) % len(candidates) for i, r in enumerate(candidates)}
    if config.scorer == "cost":
        return _by_cost(request, candidates, matched, session_replica, config, turn)
    return _by_threshold(request, candidates, matched, session_replica, config, turn)


def _by_cost(
    request: RouteRequest,
    candidates: list[ReplicaView],
    matched: dict[str, int],
    session_replica: str | None,
    config: ScoringConfig,
    turn: dict[str, int],
) -> Decision:
    base = {r.id: estimated_ttft(r, matched[r.id], request, config) for r in candidates}
    cost = dict(base)
    if session_replica is not None:
        cost[session_replica] -= config.session_affinity_seconds
    ranked = sorted(candidates, key=lambda r: (cost[r.id], turn[r.id]))
    chosen = ranked[0].id
    best_match = max(matched.values())
    without_session = min(candidates, key=lambda r: (base[r.id], turn[r.id])).id
    if chosen == session_replica and without_session != chosen:
        reason = "session"
    elif best_match == 0:
        reason = "miss"
    elif matched[chosen] == best_match:
        reason = "hit"
    else:
        reason = "load-fallback"
    return Decision(
        replica_id=chosen,
        reason=reason,
        fallbacks=tuple(r.id for r in ranked[1:]),
        matched_blocks=matched,
        scores=cost,
    )


def _by_threshold(
    request: RouteRequest,
    candidates: list[ReplicaView],
    matched: dict[str, int],
    session_replica: str | None,
    config: ScoringConfig,
    turn: dict[str, int],
) -> Decision:
    prompt_tokens = prompt_token_count(request)
    ratio = {
        r.id: (
            min(1.0, matched[r.id] * request.block_size / prompt_tokens) if prompt_tokens else 0.0
        )
        for r in candidates
    }
    by_load = sorted(candidates, key=lambda r: (r.load, turn[r.id]))
    lightest, heaviest = by_load[0].load, by_load[-1].load
    imbalanced = (
        heaviest - lightest > config.balance_abs_threshold
        and heaviest > config.balance_rel_threshold * lightest
    )
    best_ratio = max(ratio.values())
    if imbalanced:
        ranked = by_load
        best_match = max(matched.values())
        if best_match == 0:
            reason = "miss"
        elif matched[ranked[0].id] == best_match:
            reason = "hit"
        else:
            reason = "load-fallback"
    elif best_ratio > config.cache_threshold:
        ranked = sorted(candidates, key=lambda r: (-matched[r.id], r.load, turn[r.id]))
        reason = "hit"
    elif session_replica is not None:
        session_first = [r for r in by_load if r.id == session_replica]
        ranked = session_first + [r for r in by_load if r.id != session_replica]
        reason = "session"
    else:
        ranked, reason = by_load, "miss"
    return Decision(
        replica_id=ranked[0].id,
        reason=reason,
        fallbacks=tuple(r.id for r in ranked[1:]),
        matched_blocks=matched,
        scores=ratio,
    )
