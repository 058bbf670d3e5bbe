"""What a cache-aware policy hands its scorer, and the scorer's interface.

A cache-aware policy (:mod:`policies.cache_aware`) asks its index how many
leading blocks of the prompt each healthy replica holds, and hands a
:class:`Candidates` value to its scorer, which ranks the replicas and says
why (a :class:`~policies.types.Decision`). Two scorers, each with its own
typed options: :mod:`policies.cost_scorer` (estimated time to first token,
the default) and :mod:`policies.threshold_scorer` (sgl-router style gating).

``Candidates``: the healthy replicas sorted by id, the matched blocks of each
(0 when the index holds nothing), the session's last replica when affinity
is on and it is a candidate, and a rotating ``turn`` per replica (the
policy's request counter modulo the candidates) that breaks ties, so equal
replicas take turns instead of the first id taking all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.base import healthy
from policies.types import Decision, ReplicaView, RouteRequest


@dataclass(frozen=True, slots=True)
class Candidates:
    replicas: tuple[ReplicaView, ...]
    matched: dict[str, int]
    session_replica: str | None
    turn: dict[str, int]

    @classmethod
    def of(cls, replicas: Sequence[ReplicaView], matched_by_replica: Mapping[str, int],
           session_replica: str | None, rotation: int) -> Candidates:
        """Raises ``NoReplicaAvailable`` when no replica is healthy."""
        ordered = tuple(sorted(healthy(replicas), key=lambda r: r.id))
        matched = {r.id: matched_by_replica.get(r.id, 0) for r in ordered}
        offset = rotation % len(ordered)
        turn = {r.id: (i - offset) % len(ordered) for i, r in enumerate(ordered)}
        return cls(ordered, matched, session_replica if session_replica in matched else None,
                   turn)


class Scorer(Protocol):
    name: str

    def rank(self, request: RouteRequest, candidates: Candidates) -> Decision:
        """The chosen replica, the others in order as fallbacks, the reason and scores."""
        ...


def prompt_token_count(request: RouteRequest) -> int:
    """Prompt length, from the hashes when the gateway did not say."""
    return request.prompt_tokens or len(request.block_hashes) * request.block_size
