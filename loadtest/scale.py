"""Routing at fleet scale: the cache-aware policy's decision and index cost, by size.

    python -m loadtest.scale [--replicas 8,64,256] [--blocks 100000,1000000]
                             [--decisions 3000] [--policy prefix] [--memory tracemalloc]

The 10M-block rows are slow (minutes and several GB with the pure-Python
index): ask for them with ``--blocks 100000,1000000,10000000``.

For each (replicas, blocks) pair, in one process and with the real policy
(``policies.registry.default_registry(clock=...).create(policy)``, on an
injected clock that advances 1 ms per decision):

1. Build: ``blocks // 512`` apps, each a 512-block prompt of its own, each
   recorded once on one replica (app ``a`` on replica ``a % replicas``).
   Each replica publishes a capacity of its apps' blocks
   (``ReplicaView.block_capacity``), so the build evicts nothing beyond the
   index's own memory clamp. ``prefix`` learns through ``observe`` (what the
   gateway does after routing); ``precise`` through one ``BlockStored`` event
   per app (what the replica publishes), re-hashed by the index.
2. Memory: bytes the build added, per indexed block (the sum of
   ``indexed_blocks`` over replicas). ``tracemalloc`` (the default) counts
   Python objects and the compiled index alike (its arrays are allocated with
   ``PyMem_RawMalloc``, which tracemalloc traces); ``--memory rss`` takes the
   resident-set delta instead (the build then runs untraced, faster).
3. Decisions: ``--decisions`` prompts, each sharing 64-511 leading blocks
   with one app still held (uniform) plus 32 new blocks; ``pick`` is timed
   on a snapshot of every replica, then ``observe`` records the prompt on the
   chosen replica (touching the shared blocks, adding the new ones, evicting
   the oldest), timed too. ``hit %``: decisions whose chosen replica holds
   the whole shared run (all replicas are idle, so the best match wins).

Prints a Markdown table: decision p50/p99 in µs, wall clock and the
thread's CPU time (``time.thread_time_ns``: on a shared machine the wall p99
is mostly other processes' time slices), ``observe`` in ns per prompt block,
bytes per indexed block, the build's wall time (under tracemalloc by
default, so slower than an untraced build).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
import tracemalloc
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.machine import machine_info
from loadtest.markdown import table
from policies.base import Policy
from policies.events import BlockStored
from policies.hashing import block_hashes, chain_seed
from policies.registry import default_registry
from policies.types import ReplicaView, RouteRequest

APP_BLOCKS = 512
NEW_BLOCKS = 32
SHARED_MIN, SHARED_MAX = 64, 511
BLOCK_SIZE = 16
MODEL = "scale-model"
DECISION_STEP_SECONDS = 0.001


class StepClock:
    """The injected clock: the benchmark moves it, the policy reads it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Row:
    replicas: int
    blocks: int
    indexed_blocks: int
    build_seconds: float
    bytes_per_block: float
    pick_p50_us: float
    pick_p99_us: float
    pick_cpu_p50_us: float
    pick_cpu_p99_us: float
    observe_ns_per_block: float
    hit_ratio: float


def app_tokens(app: int) -> array:
    """A 512-block prompt of its own: block 0 names the app, so every chained hash differs."""
    tokens = array("I", range(APP_BLOCKS * BLOCK_SIZE))
    tokens[0] = app
    return tokens


def new_tokens(probe: int) -> array:
    """32 blocks no app has (token ids above any app's)."""
    tokens = array("I", range(NEW_BLOCKS * BLOCK_SIZE))
    tokens[0] = (1 << 31) + probe
    return tokens


def resident_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def index_limit(policy: Any) -> int | None:
    """The index's own per-replica memory clamp, when it has one."""
    index = getattr(policy, "index", None)
    for name in ("max_capacity_blocks", "max_blocks_per_replica"):
        value = getattr(index, name, None)
        if isinstance(value, int):
            return value
    return None


def build(policy: Policy, policy_name: str, views: list[ReplicaView], apps: int,
          seed: int) -> None:
    if policy_name == "precise":
        consumer = policy.event_consumer()
        assert consumer is not None
        for view in views:
            consumer.set_model(view.id, MODEL)
        rng = random.Random(seed)
        for app in range(apps):
            engine_hashes = tuple(rng.getrandbits(64) for _ in range(APP_BLOCKS))
            event = BlockStored(block_hashes=engine_hashes, parent_block_hash=None,
                                token_ids=tuple(app_tokens(app)), block_size=BLOCK_SIZE)
            consumer.apply_events(views[app % len(views)].id, event)
        return
    for view in views:  # the capacity arrives with a snapshot, as in the gateway
        policy.pick(RouteRequest(model=MODEL), [view])
    seed_hash = chain_seed(MODEL, None)
    for app in range(apps):
        replica_id = views[app % len(views)].id
        request = RouteRequest(model=MODEL, block_size=BLOCK_SIZE,
                               block_hashes=tuple(block_hashes(app_tokens(app), BLOCK_SIZE,
                                                               seed_hash)))
        policy.sent(request, replica_id)
        policy.prefilled(request, replica_id)


def measure(policy_name: str, replicas: int, blocks: int, decisions: int, memory: str,
            seed: int) -> Row:
    clock = StepClock()
    policy = default_registry(clock=clock).create(policy_name)
    apps = max(1, blocks // APP_BLOCKS)
    apps_per_replica = -(-apps // replicas)
    views = [ReplicaView(id=f"r{i:03d}", block_size=BLOCK_SIZE,
                         block_capacity=apps_per_replica * APP_BLOCKS) for i in range(replicas)]

    gc.collect()
    if memory == "tracemalloc":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    else:
        before = resident_bytes()
    started = time.perf_counter()
    build(policy, policy_name, views, apps, seed)
    build_seconds = time.perf_counter() - started
    gc.collect()
    if memory == "tracemalloc":
        added = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    else:
        added = resident_bytes() - before
    indexed = sum(policy.indexed_blocks(view.id) or 0 for view in views)

    # Probe only apps the index can still hold: the newest ones of each replica
    # when its memory clamp is below its capacity.
    limit = index_limit(policy)
    held_per_replica = apps_per_replica if limit is None else min(apps_per_replica,
                                                                  limit // APP_BLOCKS)
    held = [app for app in range(apps)
            if len(range(app % replicas, apps, replicas)) - app // replicas <= held_per_replica]
    seed_hash = chain_seed(MODEL, None)
    rng = random.Random(seed)
    pick_ns: list[int] = []
    pick_cpu_ns: list[int] = []
    observe_ns = observed_blocks = hits = 0
    for probe in range(decisions):
        shared = rng.randint(SHARED_MIN, SHARED_MAX)
        app = rng.choice(held)
        tokens = app_tokens(app)[: shared * BLOCK_SIZE] + new_tokens(probe)
        request = RouteRequest(model=MODEL, block_size=BLOCK_SIZE,
                               prompt_tokens=len(tokens),
                               block_hashes=tuple(block_hashes(tokens, BLOCK_SIZE, seed_hash)))
        clock.now += DECISION_STEP_SECONDS
        started_ns, started_cpu_ns = time.perf_counter_ns(), time.thread_time_ns()
        decision = policy.pick(request, views)
        pick_cpu_ns.append(time.thread_time_ns() - started_cpu_ns)
        pick_ns.append(time.perf_counter_ns() - started_ns)
        hits += decision.matched_blocks.get(decision.replica_id, 0) >= shared
        started_ns = time.perf_counter_ns()
        policy.sent(request, decision.replica_id)
        policy.prefilled(request, decision.replica_id)
        observe_ns += time.perf_counter_ns() - started_ns
        observed_blocks += len(request.block_hashes)
    return Row(replicas=replicas, blocks=blocks, indexed_blocks=indexed,
               build_seconds=build_seconds, bytes_per_block=added / max(1, indexed),
               pick_p50_us=statistics.median(pick_ns) / 1e3,
               pick_p99_us=percentile(pick_ns, 0.99) / 1e3,
               pick_cpu_p50_us=statistics.median(pick_cpu_ns) / 1e3,
               pick_cpu_p99_us=percentile(pick_cpu_ns, 0.99) / 1e3,
               observe_ns_per_block=observe_ns / max(1, observed_blocks),
               hit_ratio=hits / max(1, decisions))


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def render(rows: list[Row], memory: str) -> str:
    header = ["replicas", "blocks", "indexed", "pick p50 µs", "pick p99 µs", "CPU p50 µs",
              "CPU p99 µs", "observe ns/block", f"bytes/block ({memory})", "build s", "hit %"]
    return table(header, ([f"{r.replicas}", f"{r.blocks:,}", f"{r.indexed_blocks:,}",
                           f"{r.pick_p50_us:.0f}", f"{r.pick_p99_us:.0f}",
                           f"{r.pick_cpu_p50_us:.0f}", f"{r.pick_cpu_p99_us:.0f}",
                           f"{r.observe_ns_per_block:.0f}", f"{r.bytes_per_block:.1f}",
                           f"{r.build_seconds:.1f}", f"{100 * r.hit_ratio:.1f}"]
                          for r in rows))


def _ints(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=_ints, default=[8, 64, 256])
    parser.add_argument("--blocks", type=_ints, default=[100_000, 1_000_000],
                        help="indexed blocks per row (add 10000000 for the slow rows)")
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--policy", choices=["prefix", "precise"], default="prefix")
    parser.add_argument("--memory", choices=["tracemalloc", "rss"], default="tracemalloc")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    info = machine_info(Path(__file__).resolve().parents[1])
    print(f"policy {args.policy}, {args.decisions} decisions per row; {info['cpu']}, "
          f"{info['nproc']} cores, Python {info['python']}, {info['date']}, "
          f"commit {info['commit']}\n", flush=True)
    rows = []
    for blocks in args.blocks:
        for replicas in args.replicas:
            rows.append(measure(args.policy, replicas, blocks, args.decisions, args.memory,
                                args.seed))
            print(render(rows[-1:], args.memory).splitlines()[-1], flush=True)
    print()
    print(render(rows, args.memory), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
