"""A trace as a replay's workload: arrivals, lengths, and prompts that share what theirs did.

Reading. Any number of trace files (``gateway.trace`` lines, or a public
Mooncake trace: 512 tokens per id), concatenated and ordered by timestamp;
optionally one ``model``'s lines, a window (``offset``, ``limit``,
``duration_s``), and a pace: arrivals are ``(timestamp - first) / speed``.

Prompts. The replay never had the text, and needs none: request ``i``'s prompt
is ``input_length`` synthetic token ids in which trace block ``j`` (``block``
tokens) is derived from its hash id alone -- four tokens carrying the id's 64
bits, the rest zero -- and the tail after the last id is unique to the
request. Equal ids at the same position therefore give equal tokens, so the
replayed engines' prefix caches hit exactly where the recorded replicas
could have, at any replay block size: an engine block of 32 over a trace of
16 covers two ids, one of 16 over Mooncake's 512 is one of 32 pieces of one.
(What a trace cannot say: that a later prompt repeats an earlier *answer*,
as a multi-turn chat's next turn does. Those blocks were the engine's own
output there; here they are prompt blocks seen for the first time.)

Each prompt's block hashes -- the gateway's chain (``policies.hashing``) that
a policy matches, and the simulated engine's (``engine.sim.cache``) -- are
computed once per workload and kept as 8-byte arrays, so every replay of the
same workload (a search over replica counts) reuses them; ``prepare`` computes
them all before worker processes are forked, which then share them.
"""

from __future__ import annotations

import itertools
import math
import statistics
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.sim.cache import block_hash, root_hash
from gateway.trace.files import read_trace
from gateway.trace.format import TraceLine
from policies.hashing import block_hashes, chain_seed

ID_TOKENS = 4
"""Tokens of a synthetic block that carry its id (16 bits each)."""
TAIL_TOKEN_BASE = 1 << 20
"""Tail tokens are this plus the request's index: no two requests' tails match."""
ENGINE_SEED = 0


class WorkloadError(ValueError):
    """A trace that gives nothing to replay (the message says why)."""


@dataclass(frozen=True, slots=True)
class ReplayItem:
    index: int
    arrival: float
    """Seconds after the first request, at the replay's pace."""
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    stream: bool = True
    session: int | None = None
    replica: str | None = None
    """Who served it when it was recorded."""
    ttft_s: float | None = None
    """What the gateway measured when it was recorded."""
    cached_tokens: int | None = None


@dataclass(frozen=True)
class Recorded:
    """What the recorded run itself measured, for the side-by-side report."""

    requests: int
    replicas: tuple[str, ...]
    policies: tuple[str, ...]
    duration_s: float
    hit_rate: float | None
    """Cached over prompt tokens, over the lines whose ``cached_tokens`` is known."""
    ttft_p50_s: float | None
    ttft_p99_s: float | None

    def as_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "replicas": list(self.replicas),
                "policies": list(self.policies), "duration_s": round(self.duration_s, 3),
                "hit_rate": self.hit_rate, "ttft_p50_s": self.ttft_p50_s,
                "ttft_p99_s": self.ttft_p99_s}


@dataclass
class Workload:
    items: tuple[ReplayItem, ...]
    trace_block: int
    """Tokens per hash id in the trace."""
    model: str
    speed: float = 1.0
    policies: tuple[str, ...] = ()
    """The policies the lines say served them when they were recorded."""
    _route: dict[int, dict[int, array]] = field(default_factory=dict, repr=False)
    _engine: dict[int, dict[int, array]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.items)

    def prepare(self, block_size: int) -> None:
        """Hash every prompt now, both chains: before forking worker processes, which then
        share the hashes (copy-on-write) instead of each hashing the whole trace again."""
        for item in self.items:
            tokens = self.prompt(item)
            self.route_hashes(item, block_size, tokens)
            self.engine_hashes(item, block_size, tokens)

    @property
    def duration_s(self) -> float:
        return self.items[-1].arrival if self.items else 0.0

    def prompt(self, item: ReplayItem) -> list[int]:
        """The synthetic prompt's token ids (module docstring)."""
        block = self.trace_block
        zeros = [0] * max(0, block - ID_TOKENS)
        tokens: list[int] = []
        for hash_id in item.hash_ids:
            if len(tokens) >= item.input_length:
                break
            tokens += [(hash_id >> (16 * k)) & 0xFFFF for k in range(ID_TOKENS)][:block]
            tokens += zeros
        del tokens[item.input_length:]
        tail = TAIL_TOKEN_BASE + item.index
        tokens += [tail] * (item.input_length - len(tokens))
        return tokens

    def route_hashes(self, item: ReplayItem, block_size: int,
                     tokens: Sequence[int] | None = None) -> array:
        """The gateway's chain over the prompt: what a policy matches."""
        memo = self._route.setdefault(block_size, {})
        found = memo.get(item.index)
        if found is None:
            prompt = self.prompt(item) if tokens is None else tokens
            found = memo[item.index] = array(
                "Q", block_hashes(prompt, block_size, chain_seed(self.model, None)))
        return found

    def engine_hashes(self, item: ReplayItem, block_size: int, tokens: Sequence[int]) -> array:
        """The simulated engine's chain over the prompt (``engine.sim.cache``)."""
        memo = self._engine.setdefault(block_size, {})
        found = memo.get(item.index)
        if found is None:
            parent = root_hash(ENGINE_SEED)
            hashes = array("Q")
            for start in range(0, len(tokens) - block_size + 1, block_size):
                parent = block_hash(parent, tokens[start:start + block_size])
                hashes.append(parent)
            found = memo[item.index] = hashes
        return found

    def recorded(self) -> Recorded:
        items = self.items
        known = [i for i in items if i.cached_tokens is not None]
        prompt = sum(i.input_length for i in known)
        ttfts = sorted(i.ttft_s for i in items if i.ttft_s is not None)
        return Recorded(
            requests=len(items),
            replicas=tuple(sorted({i.replica for i in items if i.replica})),
            policies=self.policies,
            duration_s=self.duration_s * self.speed,
            hit_rate=(sum(i.cached_tokens or 0 for i in known) / prompt) if prompt else None,
            ttft_p50_s=statistics.median(ttfts) if ttfts else None,
            ttft_p99_s=nearest_rank(ttfts, 0.99) if ttfts else None)


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values by the nearest-rank rule (what p99 means here:
    the smallest value with at least ``q`` of the values at or below it)."""
    if not ordered:
        raise ValueError("no values")
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered) - 1e-9))) - 1]


def read_lines(paths: Iterable[str | Path]) -> list[TraceLine]:
    """The trace lines of every file (``gateway.trace.files``: gzip'd or not, JSON Lines or
    a known CSV); a bad line's error names its file. The secret the gateway keeps beside
    its trace (``PATH.key``, ``gateway.trace.writer``) holds no lines and is skipped, so
    ``trace.jsonl*`` takes the trace and its rotated files."""
    lines: list[TraceLine] = []
    for path in map(Path, paths):
        if path.name.endswith(".key") and path.with_name(path.name[:-4]).exists():
            continue
        lines.extend(read_trace(path))
    return lines


def build_workload(lines: Sequence[TraceLine], model: str | None = None, speed: float = 1.0,
                   offset: int = 0, limit: int | None = None,
                   duration_s: float | None = None) -> Workload:
    if speed <= 0:
        raise WorkloadError("speed must be positive")
    chosen = sorted((line for line in lines if model is None or line.model in (None, model)),
                    key=lambda line: line.timestamp_ms)
    if not chosen:
        raise WorkloadError("no trace lines" + (f" of model {model!r}" if model else ""))
    sizes = {line.block_size for line in chosen}
    if len(sizes) > 1:
        raise WorkloadError(f"lines of several block sizes {sorted(sizes)}: replay one model "
                            "at a time (--model)")
    models = {line.model for line in chosen if line.model}
    chosen = chosen[offset:]
    if limit is not None:
        chosen = chosen[:limit]
    if not chosen:
        raise WorkloadError("no trace lines left after --offset/--limit")
    start = chosen[0].timestamp_ms
    if duration_s is not None:
        chosen = list(itertools.takewhile(
            lambda line: line.timestamp_ms - start <= duration_s * 1000, chosen))
    items = tuple(
        ReplayItem(index=index, arrival=(line.timestamp_ms - start) / 1000.0 / speed,
                   input_length=line.input_length, output_length=max(1, line.output_length),
                   hash_ids=line.hash_ids,
                   stream=line.stream if line.stream is not None else True,
                   session=line.session, replica=line.replica,
                   ttft_s=line.ttft_ms / 1000.0 if line.ttft_ms is not None else None,
                   cached_tokens=line.cached_tokens)
        for index, line in enumerate(chosen))
    name = model or (models.pop() if len(models) == 1 else "trace")
    policies = tuple(sorted({line.policy for line in chosen if line.policy}))
    return Workload(items, trace_block=sizes.pop(), model=name, speed=speed, policies=policies)
