"""``/health`` under attack: slow sockets and hostile bodies against one gateway.

    python -m loadtest.health_attack [--slow 1000] [--seconds 45] [--out DIR]

Against two sim replicas and one gateway process with a probe port
(``health_port``) and ``server.max_connections`` = ``--slow`` + ``ROOM``, a
probe thread asks ``GET /health`` every 10 ms on each port (the client port
and the probe port, each on its own kept-alive connection), in three windows:

1. ``idle``: nothing else runs.
2. ``slow sockets + hostile bodies``: ``--slow`` sockets held open by a
   slowloris process (half trickle header lines, half announce an 8 MB body
   and trickle it; each one the gateway cuts at its deadline reconnects at
   once), while another process sends the soak's hostile bodies (a
   ``chat_template`` of two nested loops of 8000, and ~8 MB prompts, each
   one new) ``--concurrency`` at a time, over and over. The connection limit still has
   room: both ports must answer, p99 under 100 ms.
3. ``over the connection limit``: ``--slow`` + ``ROOM`` + 50 slow sockets
   (all trickling headers), so
   every connection the limit allows is held: the client port's ``/health``
   answers 503 (counted as failures), the probe port's must still answer 200.

Each window also reports the gateway's own event-loop wake-ups later than 50
and 250 ms (``prefixgate_event_loop_lag_seconds``), which tells the gateway's
stalls from the machine's. The attackers run in their own processes, so they
do not take the probes' interpreter. Writes ``health_attack.json`` and
``health_attack.md`` under ``--out`` (default ``loadtest/results/health-attack``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.markdown import table, write
from loadtest.processes import ServiceGroup, free_port
from loadtest.sims import SimFleetSpec, start_sims
from loadtest.soak import (
    HOSTILE_TEMPLATE,
    MODEL,
    HealthProbe,
    loop_lag,
    quantiles,
    rss_mb,
    start_gateway,
)

ROOM = 50
"""Connections above ``--slow`` the limit allows: the probes' and the hostile bodies'."""
TRICKLE = 2.0
"""Seconds between two pieces a slow socket sends."""

Event = Any  # a multiprocessing.Event (its type is not importable as a class)


async def _slow_socket(port: int, slow_body: bool, until: list[float],
                       tally: dict[str, int]) -> None:
    """One slow client, reconnecting whenever the gateway cuts it, until ``until[0]``."""
    loop = asyncio.get_running_loop()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    if slow_body:
        head += b"Content-Length: 8000000\r\n\r\n"
    piece = b'{"model": ' if slow_body else b"X-Slow: 1\r\n"
    while loop.time() < until[0]:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            tally["connect_errors"] = tally.get("connect_errors", 0) + 1
            await asyncio.sleep(TRICKLE)  # the slow client's own pace, then again
            continue
        tally["connections"] = tally.get("connections", 0) + 1
        try:
            writer.write(head)
            while loop.time() < until[0]:
                try:
                    answer = await asyncio.wait_for(reader.read(65536), TRICKLE)
                except TimeoutError:
                    writer.write(piece)
                    continue
                status = answer.split(b" ", 2)[1].decode() if answer.count(b" ") >= 2 else "closed"
                tally[status] = tally.get(status, 0) + 1
                if status == "503":
                    await asyncio.sleep(TRICKLE)  # a slow client, not a connection flood
                break
        except OSError:
            tally["reset"] = tally.get("reset", 0) + 1
        finally:
            writer.close()


def slowloris(port: int, count: int, slow_bodies: bool, seconds: float, ready: Event,
              go: Event, out: Any) -> None:
    """Process body: ``count`` slow sockets (half of them slow bodies if ``slow_bodies``,
    else all slow headers), held from their opening until ``seconds`` after ``go``;
    what the gateway answered them."""

    async def run() -> dict[str, int]:
        tally: dict[str, int] = {}
        until = [float("inf")]
        tasks = [asyncio.ensure_future(_slow_socket(port, slow_bodies and i % 2 == 1, until,
                                                    tally)) for i in range(count)]
        while tally.get("connections", 0) < count and not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)  # until every socket has been opened once
        ready.set()
        await asyncio.to_thread(go.wait)
        until[0] = asyncio.get_running_loop().time() + seconds
        await asyncio.gather(*tasks)
        return tally

    out.put(asyncio.run(run()))


def hostile_body(index: int, filler: bytes) -> bytes:
    """Even: the soak's nested-loop ``chat_template``; odd: a unique ~8 MB prompt."""
    if index % 2 == 0:
        return json.dumps({"model": MODEL, "max_tokens": 1, "chat_template": HOSTILE_TEMPLATE,
                           "messages": [{"role": "user", "content": f"hi {index}"}]}).encode()
    return (b'{"model": "%s", "max_tokens": 1, "messages": [{"role": "user", "content": '
            b'"unique %d %s"}]}' % (MODEL.encode(), index, filler))


def hostile(url: str, concurrency: int, seconds: float, ready: Event, go: Event,
            out: Any) -> None:
    """Process body: hostile bodies (:func:`hostile_body`, every prompt new),
    ``concurrency`` at a time, for ``seconds`` from ``go``."""
    filler = " ".join(f"w{j}" for j in range(1_100_000)).encode()[:7_900_000]
    ready.set()
    go.wait()

    async def run() -> dict[str, int]:
        statuses: dict[str, int] = {}
        until = asyncio.get_running_loop().time() + seconds
        async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:

            async def sender(first: int) -> None:
                index = first
                while asyncio.get_running_loop().time() < until:
                    try:
                        response = await client.post(
                            "/v1/chat/completions", content=hostile_body(index, filler),
                            headers={"content-type": "application/json"})
                        key = str(response.status_code)
                    except httpx.HTTPError as exc:
                        key = type(exc).__name__
                    statuses[key] = statuses.get(key, 0) + 1
                    index += concurrency

            await asyncio.gather(*(sender(i) for i in range(concurrency)))
        return statuses

    out.put(asyncio.run(run()))


def window(client_url: str, probe_url: str, seconds: float,
           attackers: list[tuple[Any, tuple[Any, ...]]]) -> dict[str, Any]:
    """Probe both ports for ``seconds`` while the ``attackers`` (process bodies) run."""
    context = multiprocessing.get_context("spawn")
    before = loop_lag(client_url)
    go = context.Event()
    processes, queues = [], []
    for target, args in attackers:
        ready, out = context.Event(), context.Queue()
        process = context.Process(target=target, args=(*args, seconds, ready, go, out))
        process.start()
        if not ready.wait(180):
            raise RuntimeError(f"{target.__name__} did not start")
        processes.append(process)
        queues.append(out)
    go.set()
    probes = {"client port": HealthProbe(client_url), "probe port": HealthProbe(probe_url)}
    for probe in probes.values():
        probe.start()
    time.sleep(seconds)  # the window itself: the probes measure meanwhile
    for probe in probes.values():
        probe.stopped.set()
        probe.join()
    outcomes = [queue.get(timeout=300) for queue in queues]
    for process in processes:
        process.join(timeout=60)
    after = loop_lag(client_url)
    return {"ports": {name: {**quantiles(p.latencies), "failures": p.failures}
                      for name, p in probes.items()},
            "attackers": outcomes,
            **{f"loop_lag_over_{k}": after.get(k, 0) - before.get(k, 0)
               for k in ("0.05", "0.25")}}


def report(result: dict[str, Any]) -> str:
    rows = []
    for name, w in result["windows"].items():
        for port, q in w["ports"].items():
            rows.append([name, port, str(q["n"]), str(q["failures"]), str(q["p50_ms"]),
                         str(q["p99_ms"]), str(q["max_ms"]), f'{w["loop_lag_over_0.05"]:.0f}',
                         f'{w["loop_lag_over_0.25"]:.0f}'])
    probes = table(["window", "/health on", "probes", "failures", "p50 ms", "p99 ms", "max ms",
                    "loop wake-ups > 50 ms", "> 250 ms"], rows)
    attackers = "\n".join(f"- {name}: {json.dumps(w['attackers'])}"
                          for name, w in result["windows"].items() if w["attackers"])
    return (f"{result['slow']} slow sockets, max_connections {result['max_connections']}, "
            f"{result['seconds']} s per window; gateway RSS after: {result['rss_after_mb']} MB"
            f"\n\n{probes}\n\nWhat the attackers were answered:\n\n{attackers}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow", type=int, default=1000, help="slow sockets held open")
    parser.add_argument("--seconds", type=float, default=45.0, help="length of each window")
    parser.add_argument("--concurrency", type=int, default=4, help="hostile bodies at a time")
    parser.add_argument("--out", type=Path, default=Path("loadtest/results/health-attack"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    probe_port, limit = free_port(), args.slow + ROOM
    with ServiceGroup() as group:
        replicas = start_sims(SimFleetSpec(count=2, model=MODEL, time_scale=1000.0,
                                           num_blocks=8192,
                                           extra_args=("--output-len-min", "1",
                                                       "--output-len-max", "8")),
                              group, args.out)
        url, pid = start_gateway(group, replicas, args.out, {}, health_port=probe_port,
                                 server={"max_connections": limit})
        port = int(url.rsplit(":", 1)[1])
        probe_url = f"http://127.0.0.1:{probe_port}"
        windows = {
            "idle": window(url, probe_url, min(args.seconds, 10.0), []),
            "slow sockets + hostile bodies": window(url, probe_url, args.seconds, [
                (slowloris, (port, args.slow, True)),
                (hostile, (url, args.concurrency))]),
            "over the connection limit": window(url, probe_url, min(args.seconds, 20.0), [
                (slowloris, (port, limit + 50, False))]),
        }
        rss_after = rss_mb(pid)
    result = {"slow": args.slow, "max_connections": limit, "seconds": args.seconds,
              "windows": windows, "rss_after_mb": round(rss_after, 1)}
    (args.out / "health_attack.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    write(args.out / "health_attack.md", text, title="/health under attack")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
