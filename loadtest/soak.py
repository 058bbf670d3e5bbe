"""Soak: does the gateway's memory level off, and does a hostile request stall it?

    python -m loadtest.soak [--requests 100000] [--streams 1000] [--out DIR]

Against two sim replicas (real Qwen3 tokenizer, fast clock), one gateway
process (``gateway.cli serve``, policy ``prefix``, the configured bounds):

1. ``--requests`` requests of unique prompts and unique multi-turn
   conversations (half each; every prompt and conversation new), 32 at a
   time. The gateway's RSS (``/proc/PID/status``) is sampled every second,
   and its memo sizes (``prefixgate_memo_bytes``) read at the end: RSS
   should rise while the memos fill and then stay level at their bounds.
2. ``--streams`` streaming requests open at once; every one must end with
   ``[DONE]`` and status 200.
3. A probe asks ``/health`` every 10 ms, first with nothing else running,
   then while the gateway gets requests with a hostile ``chat_template``
   (two nested loops of 8000) and unique ~8 MB prompts: its p99 latency must
   stay under 100 ms.

Writes ``soak.json`` and ``soak.md`` under ``--out`` (default
``loadtest/results/soak``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from engine.tokenizer import bundled_qwen_tokenizer_dir
from loadtest.markdown import table, write
from loadtest.processes import Service, ServiceGroup, free_port
from loadtest.sims import SimFleetSpec, start_sims

MODEL = "sim-model"
HOSTILE_TEMPLATE = ("{% for i in range(8000) %}{% for j in range(8000) %}x{% endfor %}"
                    "{% endfor %}")
WORDS = ["harbour", "boats", "ledger", "refund", "policy", "travel", "customer", "invoice", "shipping", "weather", "river", "mountain", "question", "answer", "summary", "detail", "section", "clause", "engine", "replica", "cache", "block", "token", "prefix", "memory", "bound", "limit"]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def bodies(count: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    """Unique prompts and unique conversations (up to 4 user turns), alternating."""
    rng = random.Random(seed)
    for i in range(count):
        if i % 2 == 0:
            content = f"Request {i}. " + _text(rng, 250)
            yield {"model": MODEL, "max_tokens": 2,
                   "messages": [{"role": "user", "content": content}]}
            continue
        conversation, turn = divmod(i // 2, 4)
        messages: list[dict[str, str]] = [{"role": "system", "content": "You are terse. " * 20}]
        turn_rng = random.Random(conversation)
        for t in range(turn + 1):
            messages.append({"role": "user", "content": f"Chat {conversation} turn {t}. "
                                                        + _text(turn_rng, 120)})
            if t < turn:
                messages.append({"role": "assistant", "content": f"Answer {t}."})
        yield {"model": MODEL, "max_tokens": 2, "messages": messages}


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else 0.0


class RssSampler(threading.Thread):
    def __init__(self, pid: int, progress: list[int], period: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.progress, self.period = pid, progress, period
        self.samples: list[tuple[float, int, float]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stopped.wait(self.period):
            self.samples.append((time.monotonic() - start, self.progress[0], rss_mb(self.pid)))


async def soak(url: str, count: int, progress: list[int], concurrency: int = 32) -> dict[str, int]:
    errors: dict[str, int] = {}
    work = bodies(count)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:

        async def worker() -> None:
            for body in work:
                try:
                    status = (await client.post("/v1/chat/completions", json=body)).status_code
                    key = None if status == 200 else str(status)
                except httpx.HTTPError as exc:
                    key = type(exc).__name__
                if key is not None:
                    errors[key] = errors.get(key, 0) + 1
                progress[0] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return errors


async def streams(url: str, count: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=count + 10)
    errors: dict[str, int] = {}
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as client:

        async def one(i: int) -> None:
            body = {"model": MODEL, "stream": True, "max_tokens": 8,
                    "messages": [{"role": "user", "content": f"stream {i} " + "x " * 50}]}
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    text = "".join([chunk async for chunk in response.aiter_text()])
                key = None if response.status_code == 200 and "[DONE]" in text else (
                    f"{response.status_code}" + ("" if "[DONE]" in text else " no [DONE]"))
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            if key is not None:
                errors[key] = errors.get(key, 0) + 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return {"streams": count, "errors": errors, "seconds": round(time.monotonic() - start, 1)}


class HealthProbe(threading.Thread):
    """GET /health every ``period`` on its own connection; latencies in seconds (a
    status other than 200 counts as a failure, its latency too)."""

    def __init__(self, url: str, period: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.url, self.period = url, period
        self.latencies: list[float] = []
        self.failures = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30.0) as client:
            while not self.stopped.wait(self.period):
                start = time.perf_counter()
                try:
                    client.get("/health").raise_for_status()
                except httpx.HTTPError:
                    self.failures += 1
                self.latencies.append(time.perf_counter() - start)


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values) or [0.0]

    def ms(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 1)

    return {"n": len(values), "p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": ms(1.0)}


def probe_while(url: str, attack: Any, seconds: float | None = None) -> dict[str, Any]:
    """The probe's latencies while ``attack()`` runs (or for ``seconds``), and the
    gateway's own event-loop lag over the window (``prefixgate_event_loop_lag_seconds``:
    wake-ups later than 50 and 250 ms), which tells its stalls from the machine's."""
    before = loop_lag(url)
    probe = HealthProbe(url)
    probe.start()
    outcome = asyncio.run(attack()) if attack is not None else None
    if seconds:
        time.sleep(seconds)  # the baseline window: nothing else runs
    probe.stopped.set()
    probe.join()
    after = loop_lag(url)
    lag = {f"loop_lag_over_{k}": after.get(k, 0) - before.get(k, 0) for k in ("0.05", "0.25")}
    return {**quantiles(probe.latencies), "probe_failures": probe.failures, "attack": outcome,
            **lag}


def loop_lag(url: str) -> dict[str, float]:
    """Wake-ups of the gateway's loop later than 50 and 250 ms, so far."""
    text = httpx.get(url + "/metrics", timeout=10).text
    buckets = dict(re.findall(r'prefixgate_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)',
                              text))
    total = float(buckets.get("+Inf", 0))
    return {k: total - float(v) for k, v in buckets.items() if k in ("0.05", "0.25")}


def hostile_bodies(count: int) -> list[bytes]:
    out = []
    for i in range(count):
        out.append(json.dumps({"model": MODEL, "max_tokens": 1, "chat_template": HOSTILE_TEMPLATE,
                               "messages": [{"role": "user", "content": f"hi {i}"}]}).encode())
        words = f"unique {i} " + " ".join(f"w{i}x{j}" for j in range(900_000))
        out.append(json.dumps({"model": MODEL, "max_tokens": 1,
                               "messages": [{"role": "user", "content": words[:7_900_000]}]})
                   .encode())
    return out


async def attack(url: str, payloads: list[bytes]) -> dict[str, int]:
    statuses: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=300.0) as client:

        async def send(body: bytes) -> None:
            try:
                response = await client.post("/v1/chat/completions", content=body,
                                             headers={"content-type": "application/json"})
                key = str(response.status_code)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            statuses[key] = statuses.get(key, 0) + 1

        await asyncio.gather(*(send(body) for body in payloads))
    return statuses


def memo_bytes(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("prefixgate_memo_bytes{", "prefixgate_memo_bytes_limit{")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def start_gateway(group: ServiceGroup, replicas: list[Any], out: Path,
                  limits: dict[str, int], **extra: Any) -> tuple[str, int]:
    """The gateway process (``extra``: more of its settings); its URL and pid."""
    port = free_port()
    settings = {"port": port, "policy": "prefix", "health_interval": 1.0,
                "replicas": [{"id": r.id, "url": r.url, "model": MODEL} for r in replicas],
                "models": [{"name": MODEL, "tokenizer": bundled_qwen_tokenizer_dir()}],
                "limits": limits, "log_level": "warning", **extra}
    config = out / "gateway.yaml"
    config.write_text(yaml.safe_dump(settings))
    url = f"http://127.0.0.1:{port}"
    service = group.start(Service("gateway", [sys.executable, "-m", "gateway.cli", "serve",
                                              "--config", str(config)], url + "/ready",
                                  out / "gateway.log", env={"HF_HUB_OFFLINE": "1"}),
                          timeout=120.0)
    assert service.process is not None
    return url, service.process.pid


def report(result: dict[str, Any]) -> str:
    samples = result["rss_samples"]
    marks = [samples[min(len(samples) - 1, int(f * (len(samples) - 1)))] for f in
             (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)] if samples else []
    rss = table(["elapsed s", "requests done", "gateway RSS MB"],
                [[f"{t:.0f}", str(done), f"{mb:.0f}"] for t, done, mb in marks])
    memos = table(["memo", "bytes (MB)", "bound (MB)"], [
        [re.sub(r'.*memo="([^"]+)".*', r"\1", k) + (' (' + re.sub(r'.*model="([^"]+)".*', r"\1", k)
                                                      + ")"),
         f"{v / 2**20:.1f}",
         f"{result['memos'].get(k.replace('prefixgate_memo_bytes{', 'prefixgate_memo_bytes_limit{'), 0) / 2**20:.0f}"]
        for k, v in sorted(result["memos"].items()) if k.startswith("prefixgate_memo_bytes{")])
    probe = table(["window", "probes", "p50 ms", "p99 ms", "max ms", "loop wake-ups > 50 ms",
                   "> 250 ms", "attack answers"], [
        [name, str(w["n"]), str(w["p50_ms"]), str(w["p99_ms"]), str(w["max_ms"]),
         str(w.get("loop_lag_over_0.05", "-")), str(w.get("loop_lag_over_0.25", "-")),
         json.dumps(w["attack"]) if w["attack"] else "-"]
        for name, w in (("idle", result["idle"]), ("hostile template + 8 MB prompts",
                                                   result["under_attack"])) if w["n"]])
    return (f"{result['requests']} requests in {result['soak_seconds']} s, errors "
            f"{result['soak_errors'] or 0}; {result['streams']['streams']} concurrent streams "
            f"in {result['streams']['seconds']} s, errors {result['streams']['errors'] or 0}\n\n"
            f"{rss}\n\n{memos}\n\n{probe}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--attacks", type=int, default=4,
                        help="hostile-template requests and 8 MB prompts, each")
    parser.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                        help="a gateway bound (limits.KEY), e.g. piece_memo_bytes=33554432")
    parser.add_argument("--out", type=Path, default=Path("loadtest/results/soak"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    limits = {k: int(v) for k, v in (item.split("=", 1) for item in args.limit)}
    with ServiceGroup() as group:
        replicas = start_sims(SimFleetSpec(count=2, model=MODEL, time_scale=1000.0,
                                           num_blocks=8192,
                                           extra_args=("--output-len-min", "1",
                                                       "--output-len-max", "8")),
                              group, args.out)
        url, pid = start_gateway(group, replicas, args.out, limits)
        progress = [0]
        sampler = RssSampler(pid, progress)
        sampler.start()
        start = time.monotonic()
        errors = asyncio.run(soak(url, args.requests, progress))
        soak_seconds = round(time.monotonic() - start, 1)
        sampler.stopped.set()
        sampler.join()
        memos = memo_bytes(url)
        stream_result = asyncio.run(streams(url, args.streams))
        idle = probe_while(url, None, seconds=10.0)
        payloads = hostile_bodies(args.attacks)
        under_attack = probe_while(url, lambda: attack(url, payloads))
        rss_after = rss_mb(pid)
    result = {"requests": args.requests, "soak_seconds": soak_seconds, "soak_errors": errors,
              "rss_samples": sampler.samples, "memos": memos, "limits": limits,
              "streams": stream_result, "idle": idle, "under_attack": under_attack,
              "rss_after_attack_mb": round(rss_after, 1)}
    (args.out / "soak.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    write(args.out / "soak.md", text, title="Soak")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
