"""The capacity planner's arithmetic on configs whose figures are published."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gateway.cli import main as cli_main
from gateway.kv.model import ModelShape, PlanError, count_params
from gateway.kv.plan import GIB, PlanInput, plan
from gateway.kv.plan_cli import run as main

QWEN25_72B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 8192,
    "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "vocab_size": 152064, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "max_position_embeddings": 32768, "sliding_window": 131072,
    "use_sliding_window": False,
}
LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
}
LLAMA2_7B = {  # multi-head attention: no num_key_value_heads in the file
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000,
    "torch_dtype": "float16", "max_position_embeddings": 4096,
}
SMOLLM2_135M = {
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "head_dim": 64,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "vocab_size": 49152, "tie_word_embeddings": True, "dtype": "bfloat16",
    "max_position_embeddings": 8192,
}


def shape(config: dict) -> ModelShape:
    return ModelShape.from_config(config)


def test_qwen25_72b_kv_bytes_per_token_in_fp16_fp8_and_int8() -> None:
    qwen = shape(QWEN25_72B)
    fp16 = plan(qwen, PlanInput(tensor_parallel_size=4, max_model_len=32768))
    assert fp16.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert fp16.kv_bytes_per_token_per_gpu == 81_920  # 2 of the 8 KV heads per GPU
    fp8 = plan(qwen, PlanInput(tensor_parallel_size=4, kv_cache_dtype="fp8", max_model_len=32768))
    assert fp8.kv_bytes_per_token == 163_840
    int8 = plan(qwen, PlanInput(tensor_parallel_size=4, kv_cache_dtype="int8",
                                max_model_len=32768))
    assert int8.kv_cache_dtype == "int8_per_token_head"
    assert int8.kv_bytes_per_token == 2 * 80 * 8 * (128 + 4) == 168_960  # + fp32 scales
    # The same KV memory holds twice the tokens in FP8.
    assert fp8.kv_memory_bytes_per_gpu == fp16.kv_memory_bytes_per_gpu
    assert fp8.num_blocks == pytest.approx(2 * fp16.num_blocks, abs=1)


def test_parameter_counts_match_the_published_sizes() -> None:
    assert count_params(shape(QWEN25_72B)).total / 1e9 == pytest.approx(72.7, abs=0.05)
    assert count_params(shape(LLAMA3_8B)).total / 1e9 == pytest.approx(8.03, abs=0.01)
    assert count_params(shape(LLAMA2_7B)).total / 1e9 == pytest.approx(6.74, abs=0.01)
    smol = count_params(shape(SMOLLM2_135M))
    assert smol.lm_head == 0 and smol.total / 1e6 == pytest.approx(134.5, abs=0.1)


def test_multi_head_attention_and_grouped_query_attention() -> None:
    assert plan(shape(LLAMA2_7B), PlanInput()).kv_bytes_per_token == 2 * 32 * 32 * 128 * 2
    assert plan(shape(LLAMA3_8B), PlanInput()).kv_bytes_per_token == 131_072


def test_kv_heads_are_replicated_when_fewer_than_gpus() -> None:
    p = plan(shape(QWEN25_72B), PlanInput(tensor_parallel_size=16, max_model_len=32768))
    assert p.kv_heads_per_gpu == 1
    assert p.kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2
    assert p.kv_bytes_per_token == 16 * 40_960  # more than the model's 327,680: replicas
    assert "kv_heads_replicated" in {w.kind for w in p.warnings}


def test_weights_per_gpu_by_weight_dtype() -> None:
    qwen = shape(QWEN25_72B)
    params = count_params(qwen)
    bf16 = plan(qwen, PlanInput(tensor_parallel_size=4))
    assert bf16.weight_bytes == params.total * 2
    assert bf16.weight_bytes_per_gpu == pytest.approx(params.total * 2 / 4, abs=1)
    fp8 = plan(qwen, PlanInput(tensor_parallel_size=4, weight_dtype="fp8"))
    assert fp8.weight_bytes == params.linear + (params.total - params.linear) * 2
    awq = plan(qwen, PlanInput(tensor_parallel_size=4, weight_dtype="awq"))
    rest = params.total - params.linear  # embeddings, lm_head, norms: 16-bit
    assert awq.weight_bytes == int(params.linear * (0.5 + 2.5 / 128) + rest * 2)
    assert awq.weight_bytes_per_gpu / GIB == pytest.approx(9.65, abs=0.01)


def test_capacity_from_gpu_memory_utilization() -> None:
    p = plan(shape(QWEN25_72B), PlanInput(tensor_parallel_size=4, gpu_memory_gib=80,
                                          gpu_memory_utilization=0.92, reserve_gib=2,
                                          max_model_len=32768))
    expected = int(80 * GIB * 0.92) - p.weight_bytes_per_gpu - 2 * GIB
    assert p.kv_memory_bytes_per_gpu == expected
    assert p.num_blocks == expected // (81_920 * 16)
    assert p.kv_capacity_tokens == p.num_blocks * 16
    assert p.max_concurrency == pytest.approx(p.num_blocks / 2048)
    assert p.fits and not [w for w in p.warnings if w.severity == "error"]


def test_cpu_kv_space_gives_what_vllm_on_cpu_logged() -> None:
    # vLLM 0.32 on CPU, VLLM_CPU_KVCACHE_SPACE=1, --block-size 32 --max-model-len 2048:
    # "CPU KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x"
    p = plan(shape(SMOLLM2_135M), PlanInput(kv_cache_memory_bytes=GIB, block_size=32,
                                            max_model_len=2048))
    assert (p.num_blocks, p.kv_cache_size_tokens, round(p.max_concurrency, 2)) == \
        (1456, 46_592, 22.75)


def test_block_override_replaces_the_memory_figure() -> None:
    p = plan(shape(SMOLLM2_135M), PlanInput(kv_cache_memory_bytes=GIB, block_size=32,
                                            max_model_len=2048, num_gpu_blocks_override=96))
    assert (p.memory_blocks, p.num_blocks, p.kv_capacity_tokens) == (1456, 96, 3072)


def test_warnings_from_the_guide() -> None:
    qwen = shape(QWEN25_72B)
    tight = plan(qwen, PlanInput(tensor_parallel_size=4, gpu_memory_utilization=0.97,
                                 max_model_len=32768))
    headroom = next(w for w in tight.warnings if w.kind == "utilization_headroom")
    assert "--gpu-memory-utilization 0.95" in headroom.message
    one_gpu = plan(qwen, PlanInput(tensor_parallel_size=1, max_model_len=32768))
    assert {w.kind for w in one_gpu.warnings} >= {"weights_do_not_fit"}
    too_long = plan(shape(SMOLLM2_135M), PlanInput(kv_cache_memory_bytes=GIB, block_size=32,
                                                   max_model_len=8192,
                                                   num_gpu_blocks_override=100))
    message = next(w.message for w in too_long.warnings if w.kind == "context_does_not_fit")
    assert "--max-model-len 3,168 or less" in message


def test_mla_and_unknown_dtypes_are_refused() -> None:
    with pytest.raises(PlanError, match="MLA"):
        shape({**LLAMA3_8B, "kv_lora_rank": 512})
    with pytest.raises(PlanError, match="unknown KV cache dtype"):
        plan(shape(LLAMA3_8B), PlanInput(kv_cache_dtype="fp4"))


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    code = main(argv, out=out)
    return code, out.getvalue()


def test_cli_json_and_arithmetic(tmp_path: Path) -> None:
    folder = tmp_path / "Qwen2.5-72B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN25_72B))
    code, text = run([str(folder), "-tp", "4", "--kv-cache-dtype", "fp8", "--json"])
    body = json.loads(text)
    assert code == 0
    assert (body["kv_bytes_per_token"], body["kv_bytes_per_token_per_gpu"]) == (163_840, 40_960)
    code, text = run([str(folder / "config.json"), "-tp", "4"])
    assert "2 (K, V) x 80 layers x 8 KV heads x (128 dim x 2 B (auto = bfloat16)) = 327,680 B" \
        in text
    assert text.startswith("prefixgate plan: Qwen2.5-72B-Instruct:")
    code, text = run([str(folder), "-tp", "4", "--compare", "--json"])
    assert [p["kv_cache_dtype"] for p in json.loads(text)["plans"]] == \
        ["auto", "fp8", "int8_per_token_head"]


def test_cli_exit_codes(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN25_72B))
    assert run([str(config), "-tp", "1"])[0] == 1  # 72B of bf16 weights on one 80 GiB GPU
    assert run([str(tmp_path / "missing.json")])[0] == 2


def test_prefixgate_plan_is_a_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMOLLM2_135M))
    assert cli_main(["plan", str(config), "--cpu-kvcache-space", "1", "--block-size", "32",
                     "--max-model-len", "2048", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_blocks"] == 1456
