#!/usr/bin/env bash
# The bursts suite of issue #23: what `vllm bench serve` does by default (every
# request at once), side by side for each router on 4 simulated replicas.
#
#   loadtest/suites/bursts.sh OUT_DIR [SHAPE ...]
#
# Shapes: burst-512 (one new 512-token prefix per burst of 100), burst-4096,
# burst-8x1024 (eight new 1,024-token prefixes per burst), vllm-bench-100 and
# vllm-bench-1000 (vLLM's own client, its default rate inf, a shared 512-token
# prefix), vllm-bench-ramp (the same 1,000 prompts at 200 a second: a burst that
# arrives over five seconds, while the first answers come back), soak (ten
# minutes of bursts: breaker openings of healthy replicas).
# BASE=DIR adds prefixgate from another checkout (the commit before a change) as
# `prefixgate:prefix?@tree=DIR`; its policies/_blocktable*.so must be built there.
# Run from the repository root with the project's venv active (or PYTHON=...).
# About 3-4 minutes a shape on 2 cores; soak about 11 a contender (SOAK_CONTENDERS).
set -euo pipefail
OUT="${1:?usage: $0 OUT_DIR [SHAPE ...]}"; shift || true
PYTHON="${PYTHON:-python}"
# SIMS: the replicas' flags. The simulator's default engine (10k prefill tokens/s, 5 ms
# steps) is so fast that on 2 cores a burst's TTFT is mostly the load generator's and the
# routers' own CPU; LARGE=1 gives it a large model's pace (about Qwen2.5-72B on 4 GPUs:
# 3.3k prefill tokens/s, 20 ms steps, 0.5 ms a decoding sequence), where the engine's
# work dominates as it does in production.
SIMS="${SIMS:---num-blocks 2048 --time-scale 1}"
[[ -n "${LARGE:-}" ]] && SIMS="$SIMS --prefill-per-token 0.0003 --step-overhead 0.02 --decode-per-seq 0.0005"
CONTENDERS="prefixgate:prefix,prefixgate:precise"
[[ -n "${BASE:-}" ]] && CONTENDERS="$CONTENDERS,prefixgate:prefix?@tree=$BASE"
CONTENDERS="$CONTENDERS,sglang-router:cache_aware,vllm-router:cache_aware"
SELECTED="$*"

burst() {  # name, workload args...
    local name="$1"; shift
    echo "== $name ($(date -u +%H:%M:%S))"
    "$PYTHON" -m loadtest compare --replicas sim:4 --replica-args "$SIMS" \
        --contenders "$CONTENDERS" --workload burst --bursts 3 --burst-size 100 \
        --title "$name" --out "$OUT/$name" "$@"
}

bench() {  # name, prompts, vllm bench serve's extra flags...
    local name="$1" prompts="$2"; shift 2
    echo "== $name ($(date -u +%H:%M:%S))"
    "$PYTHON" -m loadtest vllm-bench --replicas sim:4 --replica-args "$SIMS" \
        --contenders "$CONTENDERS" --title "$name" --out "$OUT/$name" -- \
        --num-prompts "$prompts" --random-prefix-len 512 --random-input-len 64 \
        --random-output-len 64 "$@"
}

for name in burst-512 burst-4096 burst-8x1024 vllm-bench-100 vllm-bench-1000 vllm-bench-ramp soak; do
    [[ -z "$SELECTED" || " $SELECTED " == *" $name "* ]] || continue
    case "$name" in
      burst-512) burst "$name" --prefix-len 512 ;;
      burst-4096) burst "$name" --prefix-len 4096 ;;
      burst-8x1024) burst "$name" --prefixes 8 --prefix-len 1024 ;;
      vllm-bench-100) bench "$name" 100 ;;
      vllm-bench-1000) bench "$name" 1000 ;;
      vllm-bench-ramp) bench "$name" 1000 --request-rate 200 ;;
      soak)
        echo "== soak ($(date -u +%H:%M:%S))"
        "$PYTHON" -m loadtest compare --replicas sim:4 --replica-args "$SIMS" \
            --contenders "${SOAK_CONTENDERS:-prefixgate:prefix,prefixgate:precise}" --workload burst --bursts 60 \
            --burst-size 100 --prefix-len 512 --gap 10 --max-duration 900 \
            --title "ten minutes of bursts" --out "$OUT/$name" ;;
    esac
done
