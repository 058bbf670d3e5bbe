#!/usr/bin/env bash
# Several gateway instances (issue #12): one gateway vs two sharing routing state
# through Redis vs two on their own, the requests split between the two (each
# in turn: loadtest/split_client.py), on 4 simulated replicas with tight KV
# caches, shared-prefix and multi-turn.
#
#   loadtest/suites/fleet_redis.sh OUT_DIR [WORKLOAD ...]
#
# Needs a Redis (LOADTEST_REDIS_URL, default redis://127.0.0.1:6379/0; each run
# its own key prefix, expiring by itself). Each workload's report lands in
# OUT_DIR/<workload>/results.md; OUT_DIR/ratios.md holds every contender over
# one gateway. Run from the repository root with the project's venv active (or
# PYTHON=...). About 3-4 minutes a workload on 2 cores.
set -euo pipefail
OUT="${1:?usage: $0 OUT_DIR [WORKLOAD ...]}"; shift || true
PYTHON="${PYTHON:-python}"
CONTENDERS="prefixgate:prefix,prefixgate-2-redis:prefix,prefixgate-2:prefix"
SELECTED="$*"

run() {  # name, replica args, workload args...
    local name="$1" replica_args="$2"; shift 2
    echo "== $name ($(date -u +%H:%M:%S))"
    "$PYTHON" -m loadtest compare --replicas sim:4 --replica-args "$replica_args" \
        --contenders "$CONTENDERS" --max-duration 60 --title "$name: 1 vs 2 gateways" \
        --out "$OUT/$name" "$@"
}

for name in shared-prefix multi-turn; do
    [[ -z "$SELECTED" || " $SELECTED " == *" $name "* ]] || continue
    case "$name" in
      shared-prefix)
        run "$name" "--num-blocks 768 --time-scale 1" --workload shared-prefix \
            --groups 32 --prompts-per-group 12 --system-len 1024 --question-len 64 \
            --output-len 16 --rate 15 ;;
      multi-turn)
        run "$name" "--num-blocks 512 --time-scale 1" --workload multi-turn \
            --users 36 --rounds 5 --system-len 512 --question-len 128 --output-len 64 \
            --concurrency 12 ;;
    esac
done
runs=()
for name in shared-prefix multi-turn; do
    [[ -f "$OUT/$name/results.json" ]] && runs+=("$OUT/$name")
done
"$PYTHON" -m loadtest.ratios prefixgate:prefix "${runs[@]}" | tee "$OUT/ratios.md"
