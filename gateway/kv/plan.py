"""KV-cache capacity planning: what a KV cache dtype buys, in vLLM's own arithmetic.

Pure functions over a model's shape (``gateway.kv.model`` reads it, and its
parameter count, from a Hugging Face ``config.json``) and the launch
settings; no I/O. ``gateway.kv.plan_cli`` is the ``prefixgate plan`` command
around it.

The arithmetic, step by step (``L`` layers, ``H`` attention heads, ``Hkv`` KV
heads, ``D`` head dim, ``d`` hidden size, ``F`` MLP size, ``V`` vocabulary):

1. **KV bytes per token.** Every layer stores one K and one V vector per KV
   head: ``2 × L × Hkv × D × b`` bytes, ``b`` the KV element size: ``auto`` is
   the model's dtype (fp16/bf16: 2; vLLM serves a float32 checkpoint in 16-bit
   unless told ``--dtype float32``), ``fp8`` (e4m3/e5m2, per-tensor scale) is 1.
   ``int8`` is vLLM's ``int8_per_token_head``: 1 byte per element plus one fp32
   scale for K and one for V per token and head, i.e. ``2 × L × Hkv × (D + 4)``
   (``TritonAttentionBackend`` page layout, vLLM 0.32). Qwen2.5-72B in FP16:
   ``2 × 80 × 8 × 128 × 2 = 327,680`` bytes.
2. **Per GPU under tensor parallelism** (``tp`` GPUs): KV heads are split,
   ``Hkv / tp`` per GPU; when ``Hkv < tp`` each GPU keeps a replica of one
   head (vLLM: ``max(1, Hkv // tp)``), so the per-GPU figure stops shrinking.
   ``kv_bytes_per_token`` is the per-GPU figure times ``tp``: memory used on
   all GPUs together (replicas counted).
3. **Weights per GPU** from a parameter count: embeddings ``V × d``; per
   layer attention ``d × H·D + 2 × d × Hkv·D + H·D × d`` (+ q/k/v biases for
   Qwen2), a gated MLP ``3 × d × F`` (MoE: one per expert, plus the router and
   shared experts), two RMSNorms ``2 × d``; a final norm; ``lm_head`` ``V × d``
   unless tied. Linear layers take the weight dtype (bf16/fp16 2 bytes, fp8 1,
   awq/gptq/int4 0.5 plus a 16-bit scale and a 4-bit zero point per group of
   128: ``0.5 + 2.5/128``); embeddings, lm_head and norms stay 16-bit, as
   vLLM keeps them. The sum is divided by ``tp``.
4. **KV memory per GPU.** ``gpu_memory × gpu_memory_utilization − weights −
   reserve``, the reserve being what vLLM's start-up profile measures
   (activations at ``max_num_batched_tokens``, CUDA graphs, NCCL buffers,
   the non-torch part of the CUDA context) -- an assumption here, 2 GiB by
   default; vLLM logs the measured figure ("Available KV cache memory").
   An explicit KV size (``--kv-cache-memory-bytes``, or
   ``VLLM_CPU_KVCACHE_SPACE`` GiB on CPU) replaces the whole expression.
5. **Blocks.** ``num_blocks = kv_memory // (kv_bytes_per_token_per_gpu ×
   block_size)`` (floor, as vLLM); ``--num-gpu-blocks-override`` replaces it.
   Tokens = ``num_blocks × block_size``. A sequence at ``max_model_len`` needs
   ``ceil(max_model_len / block_size)`` blocks; vLLM's "maximum concurrency"
   is ``num_blocks`` over that, and its logged "KV cache size" is that
   concurrency times ``max_model_len``. vLLM keeps one block back (the null
   block) and refuses to start unless ``num_blocks − 1`` blocks hold one
   full-length sequence.

Warnings follow the usual deployment guide: a utilization that leaves less
than the CUDA context needs outside vLLM's budget (2-4 GB; vLLM refuses to
start when free memory is below ``gpu_memory × utilization``), weights that
do not fit, a ``max_model_len`` that does not fit, heads that do not split
evenly over ``tp``, layers the plan treats as full attention (sliding window).
Not modelled: MLA (DeepSeek) caches, hybrid/mamba layers, pipeline parallel.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gateway.kv.model import ModelShape, ParamCount, PlanError, count_params

GIB = 1 << 30
AWQ_GROUP_SIZE = 128
AWQ_BYTES_PER_WEIGHT = 0.5 + (2 + 0.5) / AWQ_GROUP_SIZE
"""4-bit weight plus, per group of 128, a 16-bit scale and a 4-bit zero point."""
SCALE_BYTES = 4
"""One fp32 scale per token, KV head and tensor (K, V) in vLLM's per-token-head modes."""

KV_DTYPES: dict[str, tuple[float, bool]] = {
    # name: (bytes per element, per-token-head fp32 scales)
    "float16": (2, False),
    "bfloat16": (2, False),
    "fp8": (1, False),
    "fp8_e4m3": (1, False),
    "fp8_e5m2": (1, False),
    "int8_per_token_head": (1, True),
    "fp8_per_token_head": (1, True),
}
KV_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16",
                    "int8": "int8_per_token_head"}
WEIGHT_DTYPES: dict[str, float] = {
    "float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "awq": AWQ_BYTES_PER_WEIGHT,
    "gptq": AWQ_BYTES_PER_WEIGHT, "int4": AWQ_BYTES_PER_WEIGHT,
}
WEIGHT_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16",
                        "fp32": "float32"}


def resolve_kv_dtype(name: str) -> str:
    """vLLM's ``--kv-cache-dtype`` name for ``name`` (``int8`` -> ``int8_per_token_head``)."""
    key = KV_DTYPE_ALIASES.get(name.lower(), name.lower())
    if key != "auto" and key not in KV_DTYPES:
        raise PlanError(f"unknown KV cache dtype {name!r}: use auto, "
                        + ", ".join(sorted({*KV_DTYPES, *KV_DTYPE_ALIASES})))
    return key


def model_element_bytes(dtype: str) -> int:
    """Bytes per element of an ``auto`` KV cache: the served dtype (fp32 checkpoints -> 16-bit)."""
    key = dtype.lower().removeprefix("torch.")
    if key in ("float16", "bfloat16", "float32", "half", "fp16", "bf16", "fp32"):
        return 2
    raise PlanError(f"unknown model dtype {dtype!r} in config.json")


@dataclass(frozen=True, slots=True)
class PlanInput:
    """Launch settings, named as vLLM's flags; memory in GiB (2**30 bytes, as vLLM logs)."""

    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    weight_dtype: str = "auto"
    """``auto`` (the config's dtype), bf16/fp16, fp8, awq/gptq/int4."""
    gpu_memory_gib: float = 80.0
    gpu_memory_utilization: float = 0.92
    max_model_len: int | None = None
    """``None``: the config's ``max_position_embeddings``, as vLLM derives it."""
    block_size: int = 16
    reserve_gib: float = 2.0
    """Activations, CUDA graphs, NCCL and non-torch memory inside the budget (vLLM profiles it)."""
    cuda_context_gib: float = 4.0
    """What the guide says the CUDA context takes outside vLLM's budget (2-4 GB)."""
    kv_cache_memory_bytes: int | None = None
    """Explicit KV size per GPU (``--kv-cache-memory-bytes``; CPU: ``VLLM_CPU_KVCACHE_SPACE``)."""
    num_gpu_blocks_override: int | None = None
    weight_params: int | None = None
    """Parameter count to use instead of the one computed from the config."""


@dataclass(frozen=True, slots=True)
class PlanWarning:
    kind: str
    message: str
    severity: str = "warning"
    """``warning``, or ``error`` when vLLM would refuse to start."""


@dataclass(frozen=True, slots=True)
class KvPlan:
    """Every figure of one plan; ``as_dict`` is the ``--json`` object."""

    inputs: PlanInput
    shape: ModelShape
    params: ParamCount
    kv_cache_dtype: str
    kv_element_bytes: int
    kv_scale_bytes: int
    weight_dtype: str
    weight_bytes_per_param: float
    kv_heads_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_token: int
    weight_bytes: int
    weight_bytes_per_gpu: int
    budget_bytes_per_gpu: int
    reserve_bytes_per_gpu: int
    kv_memory_bytes_per_gpu: int
    kv_bytes_per_block_per_gpu: int
    memory_blocks: int
    num_blocks: int
    max_model_len: int
    blocks_per_sequence: int
    warnings: tuple[PlanWarning, ...] = field(default_factory=tuple)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.inputs.block_size

    @property
    def max_concurrency(self) -> float:
        """vLLM's "maximum concurrency" at ``max_model_len``."""
        return self.num_blocks / self.blocks_per_sequence

    @property
    def kv_cache_size_tokens(self) -> int:
        """The figure vLLM logs as "KV cache size: N tokens"."""
        return int(self.max_concurrency * self.max_model_len)

    @property
    def fits(self) -> bool:
        return self.num_blocks - 1 >= self.blocks_per_sequence

    def as_dict(self) -> dict[str, Any]:
        return {
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_element_bytes": self.kv_element_bytes,
            "kv_scale_bytes_per_head": self.kv_scale_bytes,
            "kv_heads_per_gpu": self.kv_heads_per_gpu,
            "weight_dtype": self.weight_dtype,
            "params": self.params.total,
            "params_by_part": asdict(self.params),
            "weight_bytes": self.weight_bytes,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "budget_bytes_per_gpu": self.budget_bytes_per_gpu,
            "reserve_bytes_per_gpu": self.reserve_bytes_per_gpu,
            "kv_memory_bytes_per_gpu": self.kv_memory_bytes_per_gpu,
            "kv_bytes_per_block_per_gpu": self.kv_bytes_per_block_per_gpu,
            "memory_blocks": self.memory_blocks,
            "num_blocks": self.num_blocks,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_cache_size_tokens": self.kv_cache_size_tokens,
            "max_model_len": self.max_model_len,
            "blocks_per_sequence": self.blocks_per_sequence,
            "max_concurrency": round(self.max_concurrency, 4),
            "fits": self.fits,
            "inputs": asdict(self.inputs),
            "model": asdict(self.shape),
            "warnings": [asdict(w) for w in self.warnings],
        }


def _weight_dtype(inputs: PlanInput, shape: ModelShape) -> str:
    name = shape.dtype if inputs.weight_dtype == "auto" else inputs.weight_dtype
    key = name.lower().removeprefix("torch.")
    key = WEIGHT_DTYPE_ALIASES.get(key, key)
    if key not in WEIGHT_DTYPES:
        raise PlanError(f"unknown weight dtype {name!r}: use auto, " + ", ".join(WEIGHT_DTYPES))
    return "bfloat16" if key == "float32" and inputs.weight_dtype == "auto" else key


def plan(shape: ModelShape, inputs: PlanInput) -> KvPlan:
    tp = inputs.tensor_parallel_size
    if tp < 1 or inputs.block_size < 1:
        raise PlanError("tensor_parallel_size and block_size must be at least 1")
    kv_dtype = resolve_kv_dtype(inputs.kv_cache_dtype)
    element, scaled = (model_element_bytes(shape.dtype), False) if kv_dtype == "auto" \
        else KV_DTYPES[kv_dtype]
    scale = SCALE_BYTES if scaled else 0
    heads_per_gpu = max(1, shape.num_kv_heads // tp)
    per_gpu = int(2 * shape.num_layers * heads_per_gpu * (shape.head_dim * element + scale))

    params = count_params(shape)
    weight_dtype = _weight_dtype(inputs, shape)
    per_param = WEIGHT_DTYPES[weight_dtype]
    if inputs.weight_params:
        weight_bytes = int(inputs.weight_params * per_param)
    else:  # only the linear layers are quantized; the rest stays 16-bit (or fp32 when asked)
        rest = 4 if weight_dtype == "float32" else 2
        weight_bytes = int(params.linear * per_param + (params.total - params.linear) * rest)
    weight_per_gpu = math.ceil(weight_bytes / tp)

    budget = int(inputs.gpu_memory_gib * GIB * inputs.gpu_memory_utilization)
    reserve = int(inputs.reserve_gib * GIB)
    if inputs.kv_cache_memory_bytes is not None:
        kv_memory = inputs.kv_cache_memory_bytes
    else:
        kv_memory = budget - weight_per_gpu - reserve
    per_block = per_gpu * inputs.block_size
    memory_blocks = max(0, kv_memory) // per_block
    blocks = inputs.num_gpu_blocks_override or memory_blocks
    max_len = inputs.max_model_len or shape.max_position_embeddings
    if not max_len:
        raise PlanError("give --max-model-len: config.json has no max_position_embeddings")
    built = KvPlan(
        inputs=inputs, shape=shape, params=params, kv_cache_dtype=kv_dtype,
        kv_element_bytes=int(element), kv_scale_bytes=2 * scale, weight_dtype=weight_dtype,
        weight_bytes_per_param=per_param, kv_heads_per_gpu=heads_per_gpu,
        kv_bytes_per_token_per_gpu=per_gpu, kv_bytes_per_token=per_gpu * tp,
        weight_bytes=weight_bytes, weight_bytes_per_gpu=weight_per_gpu, budget_bytes_per_gpu=budget,
        reserve_bytes_per_gpu=reserve, kv_memory_bytes_per_gpu=kv_memory,
        kv_bytes_per_block_per_gpu=per_block, memory_blocks=memory_blocks, num_blocks=blocks,
        max_model_len=int(max_len), blocks_per_sequence=math.ceil(int(max_len) / inputs.block_size),
    )
    return _with_warnings(built)


def _with_warnings(p: KvPlan) -> KvPlan:
    i, s, out = p.inputs, p.shape, []
    tp = i.tensor_parallel_size
    if s.num_heads % tp:
        out.append(PlanWarning("heads_split", f"{s.num_heads} attention heads do not split over "
                               f"tensor parallel {tp}: vLLM refuses this", "error"))
    if s.num_kv_heads % tp and tp % s.num_kv_heads:
        out.append(PlanWarning("kv_heads_split", f"{s.num_kv_heads} KV heads and tensor parallel "
                               f"{tp}: neither divides the other, vLLM refuses this", "error"))
    elif s.num_kv_heads < tp:
        out.append(PlanWarning("kv_heads_replicated", f"{s.num_kv_heads} KV heads on {tp} GPUs: "
                               "each GPU keeps a replica of one head, so more tensor parallelism "
                               "no longer shrinks the KV cache per token"))
    if i.kv_cache_memory_bytes is None:
        headroom = i.gpu_memory_gib * (1 - i.gpu_memory_utilization)
        if headroom < i.cuda_context_gib:
            safer = math.floor((i.gpu_memory_gib - i.cuda_context_gib) / i.gpu_memory_gib * 100)
            out.append(PlanWarning(
                "utilization_headroom",
                f"gpu_memory_utilization {i.gpu_memory_utilization} leaves {headroom:.1f} GiB "
                f"outside vLLM's budget, less than the {i.cuda_context_gib:g} GiB a CUDA context "
                f"can take: vLLM stops at start-up if free memory is below "
                f"{i.gpu_memory_gib:g} × {i.gpu_memory_utilization}; try "
                f"--gpu-memory-utilization {safer / 100:.2f}"))
        if p.kv_memory_bytes_per_gpu <= 0:
            out.append(PlanWarning(
                "weights_do_not_fit",
                f"weights ({p.weight_bytes_per_gpu / GIB:.1f} GiB per GPU) and the reserve "
                f"({i.reserve_gib:g} GiB) leave no KV cache memory in "
                f"{p.budget_bytes_per_gpu / GIB:.1f} GiB: more GPUs or quantized weights", "error"))
    if p.num_blocks and not p.fits:
        usable = (p.num_blocks - 1) * i.block_size
        out.append(PlanWarning(
            "context_does_not_fit",
            f"max_model_len {p.max_model_len:,} needs {p.blocks_per_sequence:,} blocks but "
            f"{p.num_blocks:,} blocks leave {p.num_blocks - 1:,} after vLLM's null block: vLLM "
            f"refuses to start; use --max-model-len {usable:,} or less, a smaller KV dtype or "
            "more GPUs", "error"))
    if s.sliding_window and s.max_position_embeddings and \
            s.sliding_window < (s.max_position_embeddings or 0):
        out.append(PlanWarning("sliding_window", f"the config has a {s.sliding_window}-token "
                               "sliding window; this plan counts every layer as full attention "
                               "(an upper bound on KV per token)"))
    if p.kv_cache_dtype.endswith("per_token_head"):
        out.append(PlanWarning("per_token_head", f"{p.kv_cache_dtype}: vLLM's Triton attention "
                               "backend (GPU); 8 bytes of fp32 scales per token and KV head are "
                               "counted"))
    return replace(p, warnings=tuple(out))
