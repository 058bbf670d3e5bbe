"""``prefixgate plan``: KV-cache capacity of a model under given launch settings.

    prefixgate plan CONFIG_JSON_OR_MODEL_DIR --tensor-parallel-size N
        --kv-cache-dtype auto|fp8|int8 [--gpu-memory-gb G --gpu-memory-utilization U
        --max-model-len L --block-size B --weight-dtype auto|fp8|awq ...] [--compare] [--json]

The arithmetic is ``gateway.kv.plan``'s; this module reads ``config.json``,
prints each step with its numbers (so an operator can redo it by hand) and
the warnings, or one JSON object with ``--json``. ``--compare`` plans
``auto``, ``fp8`` and ``int8`` side by side (``--json``: ``{"plans": [...]}``).
Exit status 0, or 1 when a plan has an ``error`` warning (vLLM would refuse to
start), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from engine.cli_args import CommandParser
from gateway.kv.model import ModelShape, PlanError, load_config
from gateway.kv.plan import GIB, KvPlan, PlanInput, plan

COMPARED = ("auto", "fp8", "int8")


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="prefixgate plan", description=(
        "KV-cache capacity per GPU for a model config and vLLM launch settings, with the "
        "arithmetic shown. Memory sizes are GiB (2**30 bytes), as vLLM logs them."))
    p.add_argument("config", help="config.json (Hugging Face format) or a model folder holding one")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="GPUs one replica spans (default 1)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="auto (the model's dtype), fp8 (e4m3), fp8_e5m2, int8 "
                        "(= vLLM's int8_per_token_head), fp8_per_token_head")
    p.add_argument("--weight-dtype", "--quantization", dest="weight_dtype", default="auto",
                   help="auto (config dtype), bf16, fp16, fp8, awq, gptq, int4")
    p.add_argument("--gpu-memory-gb", type=float, default=80.0,
                   help="memory of one GPU in GiB (A100-80GB / H100: 80; default 80)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92,
                   help="share of GPU memory vLLM may use (default 0.92)")
    p.add_argument("--max-model-len", type=int, help="default: max_position_embeddings")
    p.add_argument("--block-size", type=int, default=16, help="vLLM GPU default 16; CPU 32+")
    p.add_argument("--reserve-gb", type=float, default=2.0,
                   help="activation / CUDA-graph / NCCL reserve inside the budget, per GPU "
                        "(vLLM measures it at start; default 2)")
    p.add_argument("--cuda-context-gb", type=float, default=4.0,
                   help="memory a CUDA context takes outside vLLM's budget (guide: 2-4; default 4)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--kv-cache-memory-bytes", type=int,
                      help="explicit KV cache size per GPU, as vLLM's flag (skips the budget)")
    size.add_argument("--cpu-kvcache-space", type=float, metavar="GIB",
                      help="vLLM on CPU: VLLM_CPU_KVCACHE_SPACE in GiB (skips the budget)")
    p.add_argument("--num-gpu-blocks-override", type=int,
                   help="plan with exactly this many KV blocks, as vLLM's flag of that name")
    p.add_argument("--weight-params", type=int,
                   help="parameter count to use instead of the one computed from the config")
    p.add_argument("--compare", action="store_true", help="plan auto, fp8 and int8 side by side")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _inputs(args: argparse.Namespace) -> PlanInput:
    memory = args.kv_cache_memory_bytes
    if args.cpu_kvcache_space is not None:
        memory = int(args.cpu_kvcache_space * GIB)
    return PlanInput(
        tensor_parallel_size=args.tensor_parallel_size, kv_cache_dtype=args.kv_cache_dtype,
        weight_dtype=args.weight_dtype, gpu_memory_gib=args.gpu_memory_gb,
        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
        block_size=args.block_size, reserve_gib=args.reserve_gb,
        cuda_context_gib=args.cuda_context_gb, kv_cache_memory_bytes=memory,
        num_gpu_blocks_override=args.num_gpu_blocks_override, weight_params=args.weight_params,
    )


def _b(value: float) -> str:
    """A parameter count: 72.71 B, 134.5 M."""
    return f"{value / 1e9:.2f} B" if value >= 1e9 else f"{value / 1e6:.1f} M"


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def render(p: KvPlan, name: str) -> str:
    """The human report: every step with the numbers that went into it."""
    s, i, c = p.shape, p.inputs, p.params
    tp = i.tensor_parallel_size
    kv_name = f"auto = {s.dtype}" if p.kv_cache_dtype == "auto" else p.kv_cache_dtype
    scale = f" + {p.kv_scale_bytes // 2} B fp32 scale" if p.kv_scale_bytes else ""
    model_bytes = 2 * s.num_layers * s.num_kv_heads * (s.head_dim * p.kv_element_bytes
                                                       + p.kv_scale_bytes // 2)
    lines = [
        (f"prefixgate plan: {name}: tensor parallel {tp}, KV cache {p.kv_cache_dtype}, "
         f"weights {p.weight_dtype}"),
        "",
        f"model       {s.num_layers} layers, {s.num_heads} heads ({s.num_kv_heads} KV heads) of "
        f"dim {s.head_dim}, hidden {s.hidden_size}, MLP {s.intermediate_size}"
        + (f" x {s.num_experts} experts" if s.num_experts else "") + f", vocab {s.vocab_size}",
        f"parameters  {_b(c.total)} = embeddings {_b(c.embedding)} + attention {_b(c.attention)}"
        f" + MLP {_b(c.mlp)} + norms/biases {_b(c.norms + c.biases)} + lm_head "
        + (_b(c.lm_head) if c.lm_head else "0 (tied)"),
        (f"weights     {_gib(p.weight_bytes)} ({p.weight_dtype}: {p.weight_bytes_per_param:g} B "
         f"per linear weight, 16-bit elsewhere) / {tp} GPU(s) = "
         f"{_gib(p.weight_bytes_per_gpu)} per GPU"),
        "",
        "KV per token",
        (f"  model     2 (K, V) x {s.num_layers} layers x {s.num_kv_heads} KV heads x "
         f"({s.head_dim} dim x {p.kv_element_bytes} B ({kv_name}){scale}) = {model_bytes:,} B"),
        f"  per GPU   {s.num_kv_heads} KV heads / {tp} GPU(s) -> {p.kv_heads_per_gpu} per GPU"
        + (" (replicated)" if p.kv_heads_per_gpu * tp > s.num_kv_heads else "")
        + f": {p.kv_bytes_per_token_per_gpu:,} B per token per GPU",
        (f"  all GPUs  {p.kv_bytes_per_token_per_gpu:,} x {tp} = {p.kv_bytes_per_token:,} B per "
         "token"),
        "",
        "KV memory per GPU",
    ]
    if i.kv_cache_memory_bytes is not None:
        lines.append(f"  explicit  {p.kv_memory_bytes_per_gpu:,} B = "
                     f"{_gib(p.kv_memory_bytes_per_gpu)} (--kv-cache-memory-bytes / "
                     "VLLM_CPU_KVCACHE_SPACE)")
    else:
        lines.append(
            f"  {i.gpu_memory_gib:g} GiB x {i.gpu_memory_utilization} = "
            f"{_gib(p.budget_bytes_per_gpu)} - weights {_gib(p.weight_bytes_per_gpu)} - reserve "
            f"{_gib(p.reserve_bytes_per_gpu)} (assumed; vLLM measures it) = "
            f"{_gib(p.kv_memory_bytes_per_gpu)}")
    lines += [
        "",
        "capacity",
        (f"  blocks    {max(0, p.kv_memory_bytes_per_gpu):,} B // "
         f"({p.kv_bytes_per_token_per_gpu:,} "
         f"B x {i.block_size} tokens = {p.kv_bytes_per_block_per_gpu:,} B per block) = "
         f"{p.memory_blocks:,} blocks"),
    ]
    if i.num_gpu_blocks_override is not None:
        lines.append(f"  override  --num-gpu-blocks-override {p.num_blocks:,} replaces "
                     f"{p.memory_blocks:,}")
    lines += [
        f"  tokens    {p.num_blocks:,} x {i.block_size} = {p.kv_capacity_tokens:,} tokens",
        (f"  sequences {p.num_blocks:,} / {p.blocks_per_sequence:,} blocks per "
         f"{p.max_model_len:,}-token sequence = {p.max_concurrency:.2f} at max_model_len "
         f"(vLLM logs \"KV cache size: {p.kv_cache_size_tokens:,} tokens\")"),
    ]
    if p.warnings:
        lines += ["", "warnings"]
        lines += [f"  {w.severity.upper()}: {w.message}" for w in p.warnings]
    return "\n".join(lines)


def render_compare(plans: Sequence[KvPlan], name: str) -> str:
    head = f"prefixgate plan: {name}: tensor parallel {plans[0].inputs.tensor_parallel_size}"
    rows = [head, "",
            (f"{'kv dtype':<20} {'B/token/GPU':>12} {'B/token':>10} {'KV GiB/GPU':>11} "
             f"{'blocks':>10} {'tokens':>12} "
             f"{'seqs @ ' + format(plans[0].max_model_len, ','):>12}")]
    for p in plans:
        rows.append(f"{p.kv_cache_dtype:<20} {p.kv_bytes_per_token_per_gpu:>12,} "
                    f"{p.kv_bytes_per_token:>10,} {p.kv_memory_bytes_per_gpu / GIB:>11.2f} "
                    f"{p.num_blocks:>10,} {p.kv_capacity_tokens:>12,} {p.max_concurrency:>12.2f}")
    notes = {w.message for p in plans for w in p.warnings}
    if notes:
        rows += ["", "warnings"] + [f"  {n}" for n in sorted(notes)]
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    """``prefixgate ...`` hands over the arguments after the subcommand."""
    return run(argv, sys.stdout)


def run(argv: Sequence[str], out: TextIO) -> int:
    """The command, printing to ``out`` (tests hand it a buffer)."""
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
        shape = ModelShape.from_config(config)
        inputs = _inputs(args)
        dtypes = COMPARED if args.compare else (inputs.kv_cache_dtype,)
        plans = [plan(shape, replace(inputs, kv_cache_dtype=d)) for d in dtypes]
    except PlanError as exc:
        print(f"prefixgate plan: {exc}", file=sys.stderr)
        return 2
    name = Path(args.config).name
    if name == "config.json":
        name = Path(args.config).expanduser().resolve().parent.name
    if args.json:
        body: Any = {"plans": [p.as_dict() for p in plans]} if args.compare else plans[0].as_dict()
        print(json.dumps(body, indent=2), file=out)
    else:
        print(render_compare(plans, name) if args.compare else render(plans[0], name), file=out)
    return 1 if any(w.severity == "error" for p in plans for w in p.warnings) else 0
