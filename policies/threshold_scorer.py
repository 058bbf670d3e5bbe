"""``threshold`` scorer: sgl-router / vllm-router ``cache_aware`` style gating.

1. Load is *imbalanced* when ``max - min > balance_abs_threshold`` and
   ``max > balance_rel_threshold * min`` over the healthy replicas' load:
   route to the least loaded (``load-fallback``, or ``hit`` / ``miss`` when
   that is also where the best match is, or nothing matched).
2. Otherwise, if the best match covers more than ``cache_threshold`` of the
   prompt's tokens, route to the best-matching replica (``hit``; ties go to
   the less loaded).
3. Otherwise, to the session's last replica if affinity is on (``session``),
   else to the least loaded (``miss``). sgl-router sends misses to the
   replica with the smallest tree; least load is what the tree size
   approximates.

Scores are the matched fraction of the prompt. Ties go by the rotating turn.

Options (``policy_options`` of ``prefix`` / ``precise`` with ``scorer: threshold``):

* ``cache_threshold`` (default 0.5): the hit ratio above which the match wins.
* ``balance_abs_threshold`` (default 64): imbalance, absolute (requests).
* ``balance_rel_threshold`` (default 1.5): imbalance, relative.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.scoring import Candidates, prompt_token_count
from policies.types import Decision, RouteRequest


@dataclass(frozen=True)
class ThresholdConfig:
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0:
            raise ValueError("balance_abs_threshold must not be negative")
        if self.balance_rel_threshold < 1.0:
            raise ValueError("balance_rel_threshold must be at least 1")


class ThresholdScorer:
    name = "threshold"

    def __init__(self, config: ThresholdConfig) -> None:
        self.config = config

    def rank(self, request: RouteRequest, candidates: Candidates) -> Decision:
        config, matched, turn = self.config, candidates.matched, candidates.turn
        replicas = candidates.replicas
        prompt_tokens = prompt_token_count(request)
        ratio = {r.id: (min(1.0, matched[r.id] * request.block_size / prompt_tokens)
                        if prompt_tokens else 0.0) for r in replicas}
        by_load = sorted(replicas, key=lambda r: (r.load, turn[r.id]))
        lightest, heaviest = by_load[0].load, by_load[-1].load
        imbalanced = (heaviest - lightest > config.balance_abs_threshold
                      and heaviest > config.balance_rel_threshold * lightest)
        session = candidates.session_replica
        if imbalanced:
            ranked = by_load
            best_match = max(matched.values())
            if best_match == 0:
                reason = "miss"
            elif matched[ranked[0].id] == best_match:
                reason = "hit"
            else:
                reason = "load-fallback"
        elif max(ratio.values()) > config.cache_threshold:
            ranked = sorted(replicas, key=lambda r: (-matched[r.id], r.load, turn[r.id]))
            reason = "hit"
        elif session is not None:
            ranked = ([r for r in by_load if r.id == session]
                      + [r for r in by_load if r.id != session])
            reason = "session"
        else:
            ranked, reason = by_load, "miss"
        return Decision(replica_id=ranked[0].id, reason=reason,
                        fallbacks=tuple(r.id for r in ranked[1:]), matched_blocks=matched,
                        scores=ratio)
