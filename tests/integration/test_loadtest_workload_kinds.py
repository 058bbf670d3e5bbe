"""The new request shapes against a real simulated replica (subprocess, Qwen3 tokenizer).

Each small workload is driven one request at a time through the official
``openai`` client and, where no prompt holds an earlier answer, the lean
client: every request must succeed with usage reported, a request that
repeats an earlier request's prefix must hit the replica's cache, and the
ideal bound must be computable from the prompts sent (chat with tools,
completions text).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.tokenizer import bundled_qwen_tokenizer_dir
from loadtest.bound import ideal_hit_rate
from loadtest.client import LeanClient, OpenAIClient, StreamClient
from loadtest.driver import DriveResult, drive
from loadtest.workloads.registry import build_workload
from tests.integration.conftest import MODEL, sim_args
from tests.support.sim import SimProcess

CASES: dict[str, dict[str, Any]] = {
    "rag": {"documents": 2, "document_min_len": 300, "document_max_len": 400,
            "questions_per_document": 3, "question_len": 8, "output_len": 4},
    "flattened": {"users": 2, "rounds": 3, "first_len": 200, "turn_len": 10, "output_len": 6},
    "agent": {"sessions": 2, "steps": 3, "system_len": 200, "task_len": 10, "result_len": 30,
              "output_len": 4},
    "shared-prefix-completions": {"groups": 2, "prompts_per_group": 3, "system_len": 200,
                                  "question_len": 8, "output_len": 4},
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    process = SimProcess(sim_args(0))
    try:
        yield process.start()
    finally:
        process.close()


def run(name: str, url: str, raw: bool) -> DriveResult:
    workload = build_workload(name, {**CASES[name], "concurrency": 1})

    async def go() -> DriveResult:
        client: StreamClient = (LeanClient(url, "x", 30.0) if raw
                                else OpenAIClient.connect(url, "x", 30.0))
        try:
            return await drive(workload, client, MODEL, clock=time.perf_counter)
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.mark.parametrize(("name", "raw"), [
    ("rag", False), ("rag", True), ("flattened", False), ("agent", False), ("agent", True),
    ("shared-prefix-completions", False), ("shared-prefix-completions", True)])
def test_workload_runs_and_reuses_its_prefix(sim: SimProcess, name: str, raw: bool) -> None:
    httpx.post(sim.base_url + "/reset_prefix_cache").raise_for_status()
    result = run(name, sim.base_url, raw)
    workload = build_workload(name, CASES[name])
    assert len(result.records) == workload.request_count
    assert result.unsent == result.abandoned == 0
    for record in result.records:
        assert record.ok, record.error
        assert record.usage_reported and record.prompt_tokens and record.completion_tokens
    seen: set[str] = set()
    for record in sorted(result.records, key=lambda r: r.sent_at):
        if record.group in seen:  # a later question on a document, a later turn ...
            assert record.cached_tokens and record.cached_tokens >= 16, record
        seen.add(record.group)
    bound, _ = ideal_hit_rate(result.prompts, bundled_qwen_tokenizer_dir(), 1024, 16, MODEL)
    assert 0.0 < bound < 1.0
