"""The yardstick: the hit rate of one ideal replica holding all replicas' caches.

Every prompt a run actually sent (with its send time) is rendered and
tokenized with the same tokenizer and chat template the simulated replicas
use (:mod:`engine.tokenizer`; a chat request with its ``tools``, a
completions ``prompt`` as plain text with special tokens, as vLLM does), cut
into the replicas' KV blocks and replayed, in send order, through ONE cache
whose capacity is the sum of the replicas' capacities. No router can place
requests better than a single cache that big (up to second-order effects of
concurrency), so ``hit rate / bound`` says how much of the reachable cache
benefit a router got.

The cache model is ``policies.simulate.ideal_bound``: an LRU of block
hashes, a request's blocks touched last-to-first; it counts hit tokens over
prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.tokenizer import Renderer, load_renderer
from loadtest.driver import SentPrompt
from policies.hashing import block_hashes, chain_seed
from policies.simulate import ReplayReplica, SimRequest, ideal_bound
from policies.types import RouteRequest


def _bound(prompts: Sequence[tuple[float, list[int]]], capacity_blocks: int,
           block_size: int, model: str) -> float:
    seed = chain_seed(model, None)
    stream = [
        SimRequest(arrival=at, request=RouteRequest(
            model=model, block_hashes=tuple(block_hashes(tokens, block_size, seed)),
            prompt_tokens=len(tokens), block_size=block_size))
        for at, tokens in prompts
    ]
    return float(ideal_bound(stream, [ReplayReplica("ideal", capacity_blocks)]))


def prompt_token_ids(renderer: Renderer, prompt: SentPrompt) -> list[int]:
    """The tokens a replica computes for one sent prompt."""
    if prompt.prompt is not None:
        return renderer.text_token_ids(prompt.prompt)
    request: dict[str, Any] = {"messages": list(prompt.messages)}
    if prompt.tools:
        request["tools"] = list(prompt.tools)
    return renderer.chat_token_ids(request)


def ideal_hit_rate(sent: Sequence[SentPrompt], tokenizer: str | None, capacity_blocks: int,
                   block_size: int, model: str) -> tuple[float, str]:
    """(bound, which cache model computed it)."""
    renderer = load_renderer(tokenizer)
    prompts = [(p.sent_at, prompt_token_ids(renderer, p)) for p in sent]
    return _bound(prompts, capacity_blocks, block_size, model), "policies.simulate.ideal_bound"
