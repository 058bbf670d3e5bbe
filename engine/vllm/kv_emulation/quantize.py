"""Round-trip K and V through a quantized KV-cache dtype, as a vLLM cache would store them.

Runs only where torch is installed (the vLLM-on-CPU venv). Every K and V
tensor a layer writes to its cache is quantized and dequantized at once, and
attention reads the dequantized values -- also for the tokens of the current
forward pass, because vLLM's attention reads K/V back from the cache it just
wrote. Shapes are ``[batch, kv_heads, tokens, head_dim]``; keys arrive after
RoPE, as vLLM caches them.

Modes:

``auto``
    bf16, the model's dtype: what vLLM stores with ``--kv-cache-dtype auto``
    (the model computes in float32 here, so this is the baseline's rounding).
``fp8``
    FP8 E4M3 (``torch.float8_e4m3fn``) with a per-tensor scale of 1.0 --
    vLLM's default when the checkpoint carries no calibrated ``k_scale`` /
    ``v_scale``; values beyond E4M3's +-448 saturate.
``int8``
    vLLM's ``int8_per_token_head``: per token and KV head, scale =
    ``max|x| / 127`` (fp32), ``q = round(x / scale)`` in [-127, 127].
``int2``
    A deliberately broken candidate: 2 bits per element, per token and head,
    asymmetric (min..max in 3 steps). It exists to prove the gate fails a bad
    KV cache.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

MODES = ("auto", "fp8", "int8", "int2")
FP8_MAX = 448.0


def round_trip(x: torch.Tensor, mode: str) -> torch.Tensor:
    """``x`` after being stored in a ``mode`` KV cache and read back, in ``x``'s dtype."""
    if mode == "auto":
        return x.to(torch.bfloat16).to(x.dtype)
    if mode == "fp8":
        return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype)
    if mode == "int8":
        values = x.float()
        scale = values.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / 127.0
        return ((values / scale).round().clamp(-127, 127) * scale).to(x.dtype)
    if mode == "int2":
        values = x.float()
        low = values.amin(dim=-1, keepdim=True)
        step = ((values.amax(dim=-1, keepdim=True) - low) / 3.0).clamp_min(1e-8)
        return (((values - low) / step).round().clamp(0, 3) * step + low).to(x.dtype)
    raise ValueError(f"unknown KV emulation mode {mode!r}: one of {', '.join(MODES)}")


class QuantizedKVCache(DynamicCache):
    """A ``DynamicCache`` whose stored K/V went through :func:`round_trip`."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown KV emulation mode {mode!r}: one of {', '.join(MODES)}")
        super().__init__()
        self.mode = mode

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return super().update(round_trip(key_states, self.mode),
                              round_trip(value_states, self.mode), layer_idx, *args, **kwargs)
