#!/usr/bin/env bash
# The routing-quality suite of issue #8: one side-by-side comparison per
# request shape, on 4 simulated replicas with tight KV caches (one cannot hold
# the working set, four can), every contender in front of the same replicas.
#
#   loadtest/suites/routing_shapes.sh OUT_DIR [WORKLOAD ...]
#
# Each workload's report lands in OUT_DIR/<workload>/report.md (and .json,
# plots). Run from the repository root with the project's venv active (or
# PYTHON=...). About 4-6 minutes a workload on 2 cores. CONTENDERS=... replaces the
# contenders (e.g. this commit and the one before: prefixgate:prefix?@tree=DIR).
# REPEAT=N runs the suite N times into OUT_DIR/run-1 .. run-N, the contenders' order
# rotated by one each time (the first contender of a run loses some of its tail), and
# writes OUT_DIR/medians.md: each contender's median hit rate and TTFT p99 a workload
# (python -m loadtest.medians).
set -euo pipefail
ROOT="${1:?usage: $0 OUT_DIR [WORKLOAD ...]}"; shift || true
REPEAT="${REPEAT:-1}"
PYTHON="${PYTHON:-python}"
TRACE="${MOONCAKE_TRACE:-$(cd "$(dirname "$0")/../../.." && pwd)/shared/data/mooncake}"
CONTENDERS="${CONTENDERS:-prefixgate:prefix,prefixgate:precise,prefixgate:round_robin,sglang-router:cache_aware,vllm-router:cache_aware}"
SHARED="--groups 32 --prompts-per-group 16 --system-len 1024 --question-len 64 --output-len 16 --rate 25"

run() {  # name, replica args, contenders, workload args...
    local name="$1" replica_args="$2" contenders="$3"; shift 3
    echo "== $name ($(date -u +%H:%M:%S))"
    "$PYTHON" -m loadtest compare --replicas sim:4 --replica-args "$replica_args" \
        --contenders "$contenders" --max-duration 60 --title "$name" --out "$OUT/$name" "$@"
}

SELECTED="$*"

suite() {
for name in shared-prefix multi-turn mooncake rag flattened agent shared-prefix-completions \
            shared-prefix-bytes; do
    [[ -z "$SELECTED" || " $SELECTED " == *" $name "* ]] || continue
    case "$name" in
      shared-prefix|shared-prefix-completions)
        # shellcheck disable=SC2086
        run "$name" "--num-blocks 768 --time-scale 1" "$CONTENDERS" --workload "$name" $SHARED ;;
      shared-prefix-bytes)  # no tokenizer: the replicas' root is not a folder on this host
        # shellcheck disable=SC2086
        run "$name" "--num-blocks 768 --time-scale 1 --model-root /models/on-another-host" \
            "prefixgate:prefix,prefixgate-bytes:prefix,prefixgate:round_robin,sglang-router:cache_aware,vllm-router:cache_aware" \
            --workload shared-prefix $SHARED ;;
      multi-turn)
        run "$name" "--num-blocks 512 --time-scale 1" "$CONTENDERS" --workload multi-turn \
            --users 48 --rounds 5 --system-len 512 --question-len 128 --output-len 64 --concurrency 12 ;;
      mooncake)
        run "$name" "--num-blocks 768 --time-scale 1" "$CONTENDERS" --workload mooncake \
            --trace "$TRACE" --family-sample 10 --length-scale 0.03125 --time-scale 40 \
            --output-scale 0.25 --max-output-len 64 ;;
      rag)
        run "$name" "--num-blocks 384 --time-scale 1" "$CONTENDERS" --workload rag \
            --documents 8 --document-min-len 1000 --document-max-len 2000 \
            --questions-per-document 32 --question-len 32 --output-len 16 --rate 20 ;;
      flattened)
        run "$name" "--num-blocks 512 --time-scale 1" "$CONTENDERS" --workload flattened \
            --users 32 --rounds 8 --first-len 1024 --turn-len 96 --output-len 32 --concurrency 12 ;;
      agent)
        run "$name" "--num-blocks 768 --time-scale 1" "$CONTENDERS" --workload agent \
            --sessions 32 --steps 6 --system-len 1024 --task-len 64 --result-len 256 \
            --output-len 32 --concurrency 12 ;;
    esac
done
}

IFS=, read -ra ORDER <<< "$CONTENDERS"
for ((i = 0; i < REPEAT; i++)); do
    if ((REPEAT == 1)); then
        OUT="$ROOT"
    else
        OUT="$ROOT/run-$((i + 1))"
        k=$((i % ${#ORDER[@]}))
        CONTENDERS="$(IFS=,; echo "${ORDER[*]:k},${ORDER[*]:0:k}")"
        CONTENDERS="${CONTENDERS%,}"
        echo "== run $((i + 1)) of $REPEAT: $CONTENDERS"
    fi
    suite
done
if ((REPEAT > 1)); then
    "$PYTHON" -m loadtest.medians "$ROOT"/run-* | tee "$ROOT/medians.md"
fi
