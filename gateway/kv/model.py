"""A model's shape and parameter count, read from its Hugging Face ``config.json``.

The planner (``gateway.kv.plan``) needs two things from a config: the
attention shape that sizes the KV cache (layers, KV heads, head dim) and a
parameter count that sizes the weights. Fields are read under the names
Llama, Qwen2, Mistral and most decoder-only configs use (GPT-2 style aliases
as fallbacks); multimodal checkpoints keep them under ``text_config``.
``num_key_value_heads`` absent means multi-head attention (one KV head per
query head); ``head_dim`` absent means ``hidden_size / num_attention_heads``;
``tie_word_embeddings`` absent means an lm_head of its own.

Parameters (``d`` hidden size, ``H`` heads, ``Hkv`` KV heads, ``D`` head
dim, ``F`` MLP size, ``V`` vocabulary, ``L`` layers):

* embeddings ``V × d``; ``lm_head`` ``V × d`` unless tied;
* per layer, attention ``d × H·D + 2 × d × Hkv·D + H·D × d``, plus q/k/v
  biases ``H·D + 2·Hkv·D`` for Qwen2 (or ``attention_bias: true``);
* per layer, a gated MLP ``3 × d × F``; MoE configs (``num_local_experts`` /
  ``num_experts``) have one per expert at ``moe_intermediate_size``, a
  router ``d × experts`` and shared experts;
* two RMSNorms per layer ``2 × d`` and a final one ``d``.

Qwen2.5-72B comes to 72.71 B, Llama-3-8B to 8.03 B, SmolLM2-135M to 134.5 M
(their published sizes). MLA (DeepSeek's ``kv_lora_rank``) is refused: its
latent cache does not follow the K/V arithmetic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QKV_BIAS_MODELS = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})


class PlanError(ValueError):
    """The config or the settings cannot be planned (the message says which field)."""


def _field(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    if default is None:
        raise PlanError(f"config.json has none of {', '.join(names)}")
    return default


def load_config(path: str | Path) -> dict[str, Any]:
    """``config.json`` itself, or the one inside a model folder."""
    target = Path(path).expanduser()
    if target.is_dir():
        target = target / "config.json"
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(f"cannot read {target}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PlanError(f"{target} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{target} holds no JSON object")
    return data


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the arithmetic needs from ``config.json``."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    dtype: str
    max_position_embeddings: int | None = None
    num_experts: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    sliding_window: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        # Multimodal checkpoints keep the language model's sizes in text_config.
        text = config.get("text_config") or config
        model_type = str(text.get("model_type") or config.get("model_type") or "")
        if text.get("kv_lora_rank"):
            raise PlanError(f"{model_type or 'this model'} uses MLA (kv_lora_rank): its "
                            "latent KV cache is not modelled by this planner")
        heads = int(_field(text, "num_attention_heads", "n_head"))
        hidden = int(_field(text, "hidden_size", "n_embd", "d_model"))
        experts = int(text.get("num_local_experts") or text.get("num_experts") or 0)
        sliding = text.get("sliding_window") if text.get("use_sliding_window", True) else None
        return cls(
            model_type=model_type,
            num_layers=int(_field(text, "num_hidden_layers", "n_layer", "num_layers")),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(_field(text, "num_key_value_heads", default=heads)),
            head_dim=int(_field(text, "head_dim", default=hidden // heads)),
            intermediate_size=int(_field(text, "intermediate_size", "n_inner",
                                         default=4 * hidden)),
            vocab_size=int(_field(text, "vocab_size")),
            tie_word_embeddings=bool(config.get("tie_word_embeddings",
                                                text.get("tie_word_embeddings", False))),
            qkv_bias=bool(text.get("attention_bias", model_type in QKV_BIAS_MODELS)),
            dtype=str(text.get("torch_dtype") or text.get("dtype")
                      or config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
            max_position_embeddings=text.get("max_position_embeddings"),
            num_experts=experts,
            expert_intermediate_size=int(text.get("moe_intermediate_size")
                                         or text.get("intermediate_size") or 0)
            if experts else 0,
            shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size")
                                                or 0),
            sliding_window=int(sliding) if sliding else None,
        )


@dataclass(frozen=True, slots=True)
class ParamCount:
    """Parameters by part; ``linear`` is what weight quantization applies to."""

    embedding: int
    attention: int
    mlp: int
    norms: int
    biases: int
    lm_head: int

    @property
    def linear(self) -> int:
        return self.attention + self.mlp

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.mlp + self.norms + self.biases + self.lm_head


def count_params(shape: ModelShape) -> ParamCount:
    d = shape.hidden_size
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    attention = d * q + 2 * d * kv + q * d
    if shape.num_experts:
        mlp = (shape.num_experts * 3 * d * shape.expert_intermediate_size + d * shape.num_experts
               + 3 * d * shape.shared_expert_intermediate_size)
    else:
        mlp = 3 * d * shape.intermediate_size
    layers = shape.num_layers
    return ParamCount(
        embedding=shape.vocab_size * d,
        attention=layers * attention,
        mlp=layers * mlp,
        norms=layers * 2 * d + d,
        biases=layers * (q + 2 * kv) if shape.qkv_bias else 0,
        lm_head=0 if shape.tie_word_embeddings else shape.vocab_size * d,
    )
