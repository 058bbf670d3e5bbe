"""What following a replica's KV events costs the gateway's loop, per message.

    python -m loadtest.kv_events_cost [--messages 2000] [--gap-ms 2] [--blocks 8]
        [--events 16] [--repeat 3] [--tree DIR ...]

A replica publishes one message each engine step. This starts a real ZMQ
publisher in a thread, sending ``--messages`` messages ``--gap-ms`` apart (so
each one wakes the loop, as a replica's steps do), each a batch of
``--events`` ``BlockStored`` events of ``--blocks`` blocks of 16 tokens (vLLM's
wire format: ``[topic, seq, msgpack([ts, [event maps], rank])]``), and a real
``KVEventSubscriber`` on a uvloop loop that decodes each message and hands it
to a callback. It reports the loop thread's CPU (user + system) per message.

With ``--tree`` the same run is made once per checkout given (each in its own
process, ``PYTHONPATH`` set to it), ``--repeat`` times in alternation, and the
medians are printed side by side: the commit before a change against it. The
decoding alone (``decode_payload`` of one message, in a loop) is timed too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
import timeit

import msgpack
import orjson


def payload(events: int, blocks: int, rng: random.Random) -> bytes:
    """A batch of ``events`` stored-block events in vLLM's wire form (the simulated
    engine's encoder, ``engine.sim.events``), ``blocks`` blocks of 16 tokens each."""
    from engine.sim.events import StoredBlocks, batch_to_wire

    batch = [StoredBlocks(tuple(rng.getrandbits(64) for _ in range(blocks)), rng.getrandbits(64),
                          tuple(rng.randrange(150_000) for _ in range(blocks * 16)), 16,
                          (None,) * blocks) for _ in range(events)]
    return msgpack.packb(batch_to_wire(time.time(), list(batch)))


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


async def _follow(args: argparse.Namespace) -> dict[str, float]:
    import zmq

    from engine.kv_events import KVEventSubscriber, SubscriberConfig, decode_payload

    body = payload(args.events, args.blocks, random.Random(7))
    decode_us = min(timeit.repeat(lambda: decode_payload(body), number=200, repeat=5)) / 200 * 1e6
    publisher: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    port = publisher.bind_to_random_port("tcp://127.0.0.1")
    got = 0
    done = asyncio.Event()

    def on_batch(replica: str, batch: object) -> None:
        nonlocal got
        got += 1
        if got == args.messages:
            done.set()

    subscriber = KVEventSubscriber(SubscriberConfig("r", f"tcp://127.0.0.1:{port}"), on_batch)
    subscriber.start()
    await asyncio.wait_for(subscriber.caught_up.wait(), 10)
    # The subscription reaches the publisher shortly after the connection: probe until
    # a message gets through, then count from a fresh start.
    for seq in range(10_000):
        publisher.send_multipart([b"kv", seq.to_bytes(8, "big", signed=True), body])
        await asyncio.sleep(0.01)
        if got:
            break
    await asyncio.sleep(0.2)
    got, first = 0, seq + 1

    def publish() -> None:
        for n in range(args.messages):
            publisher.send_multipart([b"kv", (first + n).to_bytes(8, "big", signed=True), body])
            time.sleep(args.gap_ms / 1000)

    sender = threading.Thread(target=publish)
    start = _thread_cpu()
    sender.start()
    await asyncio.wait_for(done.wait(), 60 + args.messages * args.gap_ms / 1000 * 4)
    spent = _thread_cpu() - start
    sender.join()
    await subscriber.aclose()
    publisher.close(linger=0)
    return {"loop_us_per_message": spent / args.messages * 1e6, "decode_us": decode_us}


def _one(args: argparse.Namespace) -> dict[str, float]:
    import uvloop

    return uvloop.run(_follow(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.kv_events_cost")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--events", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tree", action="append", default=[],
                        help="a checkout of prefixgate to measure (repeatable); default: this one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.json:  # one run, in a child process
        print(orjson.dumps(_one(args)).decode())
        return 0
    trees = args.tree or [os.getcwd()]
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    child = [sys.executable, os.path.abspath(__file__), "--json",
             "--messages", str(args.messages), "--gap-ms", str(args.gap_ms),
             "--events", str(args.events), "--blocks", str(args.blocks)]
    for _ in range(args.repeat):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            out = subprocess.run(child, env=env, check=True,
                                 capture_output=True, text=True).stdout
            runs[tree].append(orjson.loads(out.strip().splitlines()[-1]))
    print(f"{args.messages} messages {args.gap_ms:g} ms apart, each {args.events} events of "
          f"{args.blocks} blocks of 16 tokens; median of {args.repeat} runs (all runs)\n")
    print("| checkout | loop CPU per message, us | decoding one message, us |")
    print("|---|---|---|")
    for tree, results in runs.items():
        loop = [r["loop_us_per_message"] for r in results]
        decode = [r["decode_us"] for r in results]
        print(f"| {tree} | {statistics.median(loop):.1f} ({', '.join(f'{x:.0f}' for x in loop)})"
              f" | {statistics.median(decode):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
