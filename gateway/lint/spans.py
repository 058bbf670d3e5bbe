"""Resolve the detector's raw hits: longest span wins, adjacent temporal pieces compose.

``longest_wins`` keeps non-overlapping hits, longest first (ties: higher
confidence, then the more specific family in ``PRIORITY``). ``merge`` joins a
chain of adjacent temporal pieces (weekday, date, time) into one hit whose
kind says what it holds: a date and a time make a ``timestamp``.
"""

from __future__ import annotations

from bisect import bisect_left

from gateway.lint.model import Hit

TEMPORAL = frozenset({"timestamp", "date", "time", "weekday"})
FAR_CONFIDENCE = 0.5
"""Below it a date is far from now (``temporal.date_confidence``: years away)."""
PRIORITY = {kind: rank for rank, kind in enumerate((
    "jwt", "uuid", "ulid", "timestamp", "date", "epoch", "time", "email", "ip", "phone",
    "request_id", "session_id", "record_id", "relative_time", "counter", "name", "weekday", "nonce"))}


def pieces(chain: list[Hit]) -> set[str]:
    """What a chain of temporal hits holds: ``date``, ``time``, ``weekday``."""
    out: set[str] = set()
    for hit in chain:
        if hit.kind == "timestamp":
            out |= {"date", "time"}
        else:
            out.add(hit.kind)
    return out


def merge(chain: list[Hit]) -> Hit:
    """One hit for a chain of adjacent temporal pieces."""
    if len(chain) == 1:
        return chain[0]
    held = pieces(chain)
    kind = ("timestamp" if {"date", "time"} <= held else
            "date" if "date" in held else "time" if "time" in held else "weekday")
    if kind == "time" and all(h.detail == "round" for h in chain if h.kind == "time"):
        return Hit(kind, chain[0].start, chain[-1].end, chain[0].confidence, "round")
    detail = " ".join(h.detail for h in chain if h.detail and h.detail not in ("round", "short",
                                                                              "long", "paren"))
    confidence = (max(h.confidence for h in chain if h.kind != "weekday")
                  if held != {"weekday"} else chain[0].confidence)
    if kind == "timestamp":
        dated = max(h.confidence for h in chain if h.kind in ("date", "timestamp"))
        # a clock time next to a date makes it the current time, unless the date is years
        # away: then it is as likely fixed text as that date alone
        confidence = dated if dated < FAR_CONFIDENCE else max(confidence, 0.9)
    return Hit(kind, chain[0].start, chain[-1].end, confidence, detail)


def longest_wins(hits: list[Hit]) -> list[Hit]:
    """Keep non-overlapping hits, longest first; ties go to confidence, then specificity."""
    ranked = sorted(hits, key=lambda h: (-(h.end - h.start), -h.confidence,
                                         PRIORITY.get(h.kind, 99), h.start))
    starts: list[int] = []
    ends: list[int] = []
    kept: list[Hit] = []
    for hit in ranked:
        if hit.end <= hit.start:
            continue
        index = bisect_left(starts, hit.start)
        if index > 0 and ends[index - 1] > hit.start:
            continue
        if index < len(starts) and starts[index] < hit.end:
            continue
        starts.insert(index, hit.start)
        ends.insert(index, hit.end)
        kept.append(hit)
    return sorted(kept, key=lambda h: h.start)
