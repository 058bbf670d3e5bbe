"""Session affinity memory: which replica served a session last.

A bounded least-recently-used map ``session key -> (replica, last seen)``.
Entries older than ``ttl_seconds`` are ignored by :meth:`SessionTable.get`
and dropped by :meth:`SessionTable.remember`; beyond ``max_sessions`` the
least recently seen session is forgotten. The table only *remembers*; how
much a remembered replica is preferred is the scorer's business
(:mod:`policies.cost_scorer`, :mod:`policies.threshold_scorer`), which never lets it
override health or load.

Parameters:

* ``ttl_seconds`` (default 600.0): a session idle this long is forgotten.
* ``max_sessions`` (default 100_000): memory bound on remembered sessions.
"""

from __future__ import annotations

from policies.lru import LRU


class SessionTable:
    def __init__(self, *, ttl_seconds: float = 600.0, max_sessions: int = 100_000) -> None:
        if ttl_seconds <= 0 or max_sessions <= 0:
            raise ValueError("ttl_seconds and max_sessions must be positive")
        self.ttl_seconds = ttl_seconds
        self.max_sessions = max_sessions
        self._last: LRU[str, tuple[str, float]] = LRU(max_sessions)

    def get(self, session_key: str, now: float) -> str | None:
        """The replica that served the session last, unless that is stale."""
        entry = self._last.peek(session_key)
        if entry is None or entry[1] < now - self.ttl_seconds:
            return None
        return entry[0]

    def remember(self, session_key: str, replica_id: str, now: float) -> None:
        self._last.put(session_key, (replica_id, now))
        cutoff = now - self.ttl_seconds
        while (oldest := self._last.oldest()) is not None and oldest[1][1] < cutoff:
            self._last.pop(oldest[0])

    def forget_replica(self, replica_id: str) -> None:
        """Sessions of a replica that went away start over."""
        gone = [key for key, (replica, _) in self._last.items() if replica == replica_id]
        for key in gone:
            self._last.pop(key)

    def __len__(self) -> int:
        return len(self._last)
