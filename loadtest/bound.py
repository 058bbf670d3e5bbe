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

The cache model is ``policies.simulate.ideal_bound`` (an LRU of block hashes,
a request's blocks touched last-to-first) when that module is present; else
``engine.sim.cache.PrefixCache`` — the simulator's own block pool — driven
one request at a time. Both count hit tokens over prompt tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.sim.cache import PrefixCache
from engine.tokenizer import Renderer, load_renderer
from policies.hashing import block_hashes, chain_seed
from policies.types import RouteRequest

from .driver import SentPrompt

_ideal_bound: Callable[..., float] | None
try:  # the team's replay module; the simulator's own cache is the fallback
    from policies.simulate import SimReplica as _ModelReplica
    from policies.simulate import SimRequest as _ModelRequest
    from policies.simulate import ideal_bound as _ideal_bound
except ImportError:  # pragma: no cover - depends on the checkout
    _ideal_bound = None


def _bound_with_policies(prompts: Sequence[tuple[float, list[int]]], capacity_blocks: int,
                         block_size: int, model: str) -> float:
    assert _ideal_bound is not None
    seed = chain_seed(model, None)
    stream = [
        _ModelRequest(arrival=at, request=RouteRequest(
            model=model, block_hashes=tuple(block_hashes(tokens, block_size, seed)),
            prompt_tokens=len(tokens), block_size=block_size))
        for at, tokens in prompts
    ]
    return float(_ideal_bound(stream, [_ModelReplica("ideal", capacity_blocks)]))


def _bound_with_sim_cache(prompts: Sequence[tuple[float, list[int]]], capacity_blocks: int,
                          block_size: int, model: str) -> float:
    cache = PrefixCache(capacity_blocks, block_size)
    hits = queries = 0
    for _, tokens in sorted(prompts, key=lambda prompt: prompt[0]):
        hashes: list[int] = []
        cache.extend_hashes(hashes, tokens, None)
        found = cache.lookup(hashes, len(tokens))
        hits += len(found) * block_size
        queries += len(tokens)
        cache.acquire(found)
        fresh = cache.allocate(len(hashes) - len(found))
        blocks = found + (fresh or [])
        if fresh is not None:  # None: the prompt alone exceeds the cache
            cache.commit(blocks, hashes, tokens, len(found), len(blocks), None)
        cache.release(list(reversed(blocks)))
        cache.take_events()
    return hits / queries if queries else 0.0


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
    if _ideal_bound is not None:
        return (_bound_with_policies(prompts, capacity_blocks, block_size, model),
                "policies.simulate.ideal_bound")
    return _bound_with_sim_cache(prompts, capacity_blocks, block_size, model), "engine.sim.cache"
