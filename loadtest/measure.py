"""One measured run: one workload against one endpoint, with the replicas watched.

Order of events: scrape every replica's ``/metrics``; start the load sampler;
drive the workload through the official ``openai`` client (or the lean one:
``client.LeanClient``); stop the sampler;
scrape again. The result (:class:`MeasuredRun`) holds every request record,
the replica counter deltas and the load samples; :mod:`.summary` turns it
into figures. The endpoint can be anything OpenAI-compatible: a gateway, a
peer router or one replica directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import httpx

from loadtest.client import LeanClient, OpenAIClient, StreamClient
from loadtest.driver import DriveResult, drive
from loadtest.progress import Progress
from loadtest.replica_metrics import LoadSample, LoadSampler, ReplicaDelta, deltas, scrape_all
from loadtest.split_client import SplitClient
from loadtest.workloads.base import Workload


@dataclass(frozen=True, slots=True)
class RunTarget:
    label: str
    base_url: str
    """Server root, e.g. ``http://127.0.0.1:8000`` (``/v1`` is appended); several,
    comma-separated: the requests are split among them (``split_client``)."""
    model: str
    api_key: str = "unused"


@dataclass(frozen=True)
class MeasuredRun:
    label: str
    workload: str
    replica_urls: tuple[str, ...]
    drive: DriveResult
    replicas: tuple[ReplicaDelta, ...]
    load: tuple[LoadSample, ...]
    ejections: float | None = None
    """Breaker openings of the gateway's replicas during the run (prefixgate only)."""


BREAKER_OPENINGS = "prefixgate_replica_breaker_opened_total{"


@dataclass(frozen=True, slots=True)
class RunLimits:
    max_duration: float | None = 300.0
    """No new request after this many seconds."""
    request_timeout: float = 120.0
    sample_period: float = 0.5
    raw_client: bool = False
    """Drive with the lean client (``client.LeanClient``) instead of the official one;
    not for workloads whose prompts hold earlier answers."""


async def measure(
    workload: Workload,
    target: RunTarget,
    replica_urls: Sequence[str],
    limits: RunLimits = RunLimits(),
    progress_stream: TextIO | None = None,
) -> MeasuredRun:
    clock = time.perf_counter
    urls = tuple(replica_urls)
    async with httpx.AsyncClient(timeout=5.0) as scraper:
        before = await scrape_all(scraper, urls) if urls else {}
        ejected_before = await breaker_openings(scraper, target.base_url)
        clients: list[StreamClient] = []
        for base_url in target.base_url.split(","):
            if limits.raw_client:
                if any(c.needs_answers for c in workload.conversations):
                    raise ValueError("the lean client keeps no answers: no workload whose "
                                     "prompts hold earlier answers")
                clients.append(LeanClient(base_url, target.api_key, limits.request_timeout))
            else:
                clients.append(OpenAIClient.connect(base_url, target.api_key,
                                                    limits.request_timeout))
        client: StreamClient = clients[0] if len(clients) == 1 else SplitClient(clients)
        sampler = LoadSampler(scraper, urls, clock, limits.sample_period)
        progress = Progress(f"{workload.name} -> {target.label}", workload.request_count, clock,
                            stream=progress_stream)
        # The load generator's own full collections would delay its reads of
        # every stream; what it loaded so far is never garbage during the run
        # (handed back after it, as the gateway and the sim do at shutdown).
        gc.collect()
        gc.freeze()
        start = clock()
        sampling = asyncio.create_task(sampler.run(start)) if urls else None
        try:
            result: DriveResult = await drive(workload, client, target.model, clock=clock,
                                              progress=progress, max_duration=limits.max_duration)
        finally:
            gc.unfreeze()
            if sampling:
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling
            await client.close()
        # Let the replicas' counters catch up with the last finished requests.
        await asyncio.sleep(0.2)
        after = await scrape_all(scraper, urls) if urls else {}
        if urls:
            await sampler.sample(start)  # the last burst's requests, counted
        ejected_after = await breaker_openings(scraper, target.base_url)
    ejections = (ejected_after - ejected_before
                 if ejected_after is not None and ejected_before is not None else None)
    return MeasuredRun(target.label, workload.name, urls, result,
                       tuple(deltas(before, after)), tuple(sampler.samples), ejections)


async def breaker_openings(client: httpx.AsyncClient, base_urls: str) -> float | None:
    """``prefixgate_replica_breaker_opened_total`` summed over the target's replicas (and
    its instances); None when the target does not publish it (a peer router)."""
    total, found = 0.0, False
    for base_url in base_urls.split(","):
        try:
            response = await client.get(base_url.rstrip("/") + "/metrics")
        except httpx.HTTPError:
            return None
        for line in response.text.splitlines():
            if line.startswith(BREAKER_OPENINGS):
                found = True
                total += float(line.rsplit(" ", 1)[1])
    return total if found else None
