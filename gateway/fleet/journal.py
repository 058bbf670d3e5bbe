"""The compacted record of shared routing state that becomes the Redis snapshot.

The stream of batches (``gateway.fleet.codec``) grows with every routed
request; a new or restarted instance should not replay all of it. Each
instance keeps this journal of everything it learned, its own and the
others' (what its prefix index learned, in the same order), and now and then
writes it as the snapshot; a newcomer applies the snapshot, then the
stream's tail after the snapshot's id.

Per replica, an LRU of block hashes with the time each was last touched,
touched in the order the index touches them (a prompt's last block first),
so the snapshot's runs replayed oldest first rebuild the same LRU order.
Bounded: ``blocks_per_replica`` hashes per replica (the oldest go),
``max_sessions`` sessions, and nothing older than ``max_age_seconds`` is
written. No I/O; the clock is the caller's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter

from gateway.fleet.codec import Run, Snapshot


class Journal:
    def __init__(self, *, blocks_per_replica: int = 16_384, max_sessions: int = 10_000,
                 max_age_seconds: float = 300.0) -> None:
        if blocks_per_replica <= 0 or max_sessions <= 0 or max_age_seconds <= 0:
            raise ValueError("journal bounds must be positive")
        self.blocks_per_replica = blocks_per_replica
        self.max_sessions = max_sessions
        self.max_age_seconds = max_age_seconds
        self._blocks: dict[str, OrderedDict[int, float]] = {}
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.changed = False
        """Something was learned since the last snapshot was taken."""

    def routed(self, replica_id: str, block_hashes: Sequence[int], session_key: str | None,
               now: float) -> None:
        blocks = self._blocks.setdefault(replica_id, OrderedDict())
        for block_hash in reversed(block_hashes):
            blocks.pop(block_hash, None)
            blocks[block_hash] = now
        while len(blocks) > self.blocks_per_replica:
            blocks.popitem(last=False)
        if session_key is not None:
            self._sessions.pop(session_key, None)
            self._sessions[session_key] = (replica_id, now)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        self.changed = True

    def forget_replica(self, replica_id: str) -> None:
        self._blocks.pop(replica_id, None)
        for key in [k for k, (replica, _) in self._sessions.items() if replica == replica_id]:
            del self._sessions[key]
        self.changed = True

    def size(self, replica_id: str) -> int:
        return len(self._blocks.get(replica_id, ()))

    def copy(self) -> JournalCopy:
        """What the snapshot is made of, copied at C speed (list of a dict's items), so
        that making it can run in a worker thread while this journal goes on learning."""
        self.changed = False
        return JournalCopy({replica: list(blocks.items())
                            for replica, blocks in self._blocks.items()},
                           list(self._sessions.items()), self.max_age_seconds)

    def snapshot(self, stream_id: str, now: float, written_at: float) -> Snapshot:
        return self.copy().snapshot(stream_id, now, written_at)


@dataclass(frozen=True)
class JournalCopy:
    blocks: dict[str, list[tuple[int, float]]]
    """Per replica, ``(hash, last touched)`` oldest first."""
    sessions: list[tuple[str, tuple[str, float]]]
    max_age_seconds: float

    def snapshot(self, stream_id: str, now: float, written_at: float) -> Snapshot:
        """Everything younger than ``max_age_seconds`` at ``now``, covering ``stream_id``."""
        cutoff = now - self.max_age_seconds
        replicas = {replica: runs for replica, blocks in self.blocks.items()
                    if (runs := _runs(blocks, cutoff, now))}
        sessions = [(key, replica, now - seen)
                    for key, (replica, seen) in self.sessions if seen >= cutoff]
        return Snapshot(stream_id, written_at, replicas, sessions)


def _runs(blocks: list[tuple[int, float]], cutoff: float, now: float) -> list[Run]:
    """Consecutive hashes touched at one time, as one run each, oldest first.

    Within a run the journal holds a prompt's blocks last first; the run holds
    them in prompt order, as ``record`` is given them."""
    fresh = ((block_hash, touched) for block_hash, touched in blocks if touched >= cutoff)
    return [Run(now - touched, tuple(reversed([block_hash for block_hash, _ in run])))
            for touched, run in groupby(fresh, key=itemgetter(1))]
