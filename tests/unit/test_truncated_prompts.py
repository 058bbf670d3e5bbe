"""``truncate_prompt_tokens``: vLLM keeps only a generation prompt's last N tokens, so the
blocks it caches start wherever that cut falls. A prompt longer than N routes by load
(the ``truncated`` fallback) rather than on blocks the replica will never hold; one that
fits routes on its prefix as any other."""

from __future__ import annotations

from typing import Any

from engine.tokenizer import HFRenderer
from gateway.prompt.render import PromptHasher

from .fake_replica import FakeReplica
from .test_gateway_core import gateway
from .test_hostile_requests import _sample

SYSTEM = {"role": "system", "content": "You are the booking assistant of a ferry line. " * 30}


def _asking(n: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, **extra,
            "messages": [SYSTEM, {"role": "user", "content": f"Is the {n}:00 ferry full?"}]}


async def test_a_prompt_vllm_cuts_is_not_routed_on_its_start() -> None:
    replicas = [FakeReplica(name) for name in ("a", "b", "c")]
    async with gateway(replicas, policy="prefix") as client:
        warm = [await client.post("/v1/chat/completions", json=_asking(n)) for n in range(3)]
        cut = [await client.post("/v1/chat/completions",
                                 json=_asking(n, truncate_prompt_tokens=16)) for n in range(3)]
        kept = await client.post("/v1/chat/completions",
                                 json=_asking(7, truncate_prompt_tokens=100_000))
        metrics = (await client.get("/metrics")).text
    assert warm[-1].headers["x-prefixgate-reason"] == "hit"
    for answer in cut:  # the replica computes these from their cut: nothing of the start
        assert answer.status_code == 200
        assert answer.headers["x-prefixgate-reason"] != "hit"
        assert int(answer.headers.get("x-prefixgate-matched-tokens", "0")) == 0
    assert kept.headers["x-prefixgate-reason"] == "hit"  # shorter than N: not cut
    assert _sample(metrics, "prefixgate_routing_fallbacks_total", reason="truncated") == 3
    forwarded = [request for replica in replicas for request in replica.requests]
    assert sum(request.get("truncate_prompt_tokens") == 16 for request in forwarded) == 3


def test_the_hasher_routes_a_cut_prompt_on_nothing(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    whole = hasher.describe("m", _asking(1), "chat", 16)
    assert len(whole.block_hashes) > 4
    fits = hasher.describe("m", _asking(1, truncate_prompt_tokens=whole.prompt_tokens),
                           "chat", 16)
    assert fits.block_hashes == whole.block_hashes
    cut = hasher.describe("m", _asking(1, truncate_prompt_tokens=whole.prompt_tokens - 1),
                          "chat", 16)
    assert cut.block_hashes == () and cut.prompt_tokens == whole.prompt_tokens - 1
    assert hasher.fallbacks["truncated"] == 1
    every = hasher.describe("m", _asking(1, truncate_prompt_tokens=-1), "chat", 16)
    assert every.block_hashes == whole.block_hashes  # -1: all that fits the context
    completion = hasher.describe("m", {"prompt": "Tickets and fares. " * 40,
                                       "truncate_prompt_tokens": 8}, "completions", 16)
    assert completion.block_hashes == () and hasher.fallbacks["truncated"] == 2


def test_a_prompt_cut_at_its_end_keeps_the_blocks_before_the_cut(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    whole = hasher.describe("m", _asking(1), "chat", 16)
    kept = hasher.describe("m", _asking(1, truncate_prompt_tokens=40, truncation_side="right"),
                           "chat", 16)
    assert kept.block_hashes == whole.block_hashes[:2] and kept.prompt_tokens == 40
    assert "truncated" not in hasher.fallbacks
