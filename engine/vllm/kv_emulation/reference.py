"""The transformers reference model: prompt log-probabilities and greedy decoding
with an emulated quantized KV cache.

One forward pass over the prompt fills a :class:`QuantizedKVCache` and gives
the log-probability of every prompt token given the ones before it (the first
token has none, as in vLLM's ``prompt_logprobs``). Greedy decoding then feeds
one token at a time through the same cache, so every generated token sees
only round-tripped K/V. The model computes in float32 (fast on CPUs without
AVX-512 BF16; the checkpoint's bf16 weights convert exactly); ``auto`` rounds
K/V to bf16 so the baseline stores what vLLM's ``auto`` stores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.vllm.kv_emulation.quantize import QuantizedKVCache


@dataclass(frozen=True)
class Position:
    """One scored position: the token there, its log-probability and the best ``top`` tokens."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Completion:
    prompt_ids: tuple[int, ...]
    prompt: tuple[Position | None, ...]
    """One entry per prompt token; ``None`` for the first."""
    generated: tuple[Position, ...] = field(default_factory=tuple)
    finish_reason: str = "length"


def _position(logprobs: torch.Tensor, token_id: int, top: int) -> Position:
    value = logprobs[token_id]
    rank = int((logprobs > value).sum().item()) + 1
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        values, ids = torch.topk(logprobs, top)
        best = tuple((int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist()))
    return Position(token_id, float(value), rank, best)


class ReferenceModel:
    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        eos = self.tokenizer.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    @torch.inference_mode()
    def complete(self, prompt_ids: list[int], mode: str, max_tokens: int, top: int = 0,
                 stop: tuple[str, ...] = (), ignore_eos: bool = False) -> Completion:
        """Score the prompt, decode ``max_tokens`` greedily; K/V round-tripped through ``mode``."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        cache = QuantizedKVCache(mode)
        out = self.model(input_ids=torch.tensor([prompt_ids]), past_key_values=cache,
                         use_cache=True)
        logprobs = torch.log_softmax(out.logits[0].float(), dim=-1)
        scored: list[Position | None] = [None]
        scored += [_position(logprobs[i - 1], prompt_ids[i], top)
                   for i in range(1, len(prompt_ids))]
        generated: list[Position] = []
        finish = "length"
        last = logprobs[-1]
        for _ in range(max_tokens):
            token = int(torch.argmax(last).item())
            generated.append(_position(last, token, top))
            if token in self.eos_ids and not ignore_eos:
                finish = "stop"
                break
            if stop and any(s in self.decode([p.token_id for p in generated]) for s in stop):
                finish = "stop"
                break
            step = self.model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                              use_cache=True)
            last = torch.log_softmax(step.logits[0, -1].float(), dim=-1)
        return Completion(tuple(prompt_ids), tuple(scored), tuple(generated), finish)
