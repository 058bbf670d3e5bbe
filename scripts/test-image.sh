#!/usr/bin/env bash
# The gateway image, built and run without Docker (CI has no daemon, and the registry
# images the Dockerfile defaults to cannot be pulled there):
#
#   1. a Debian bookworm base with Python 3.11, made from Debian's packages by mmdebstrap;
#   2. the wheels of prefixgate and its dependencies, built here with the venv's pip
#      (the image build then needs no PyPI: --build-arg WHEELS);
#   3. the Dockerfile built by buildah with that base (--build-arg BASE), --isolation
#      chroot and the vfs storage driver: no daemon, no user namespaces, no overlay mounts;
#   4. the gateway started from the image's root filesystem (buildah run) in front of a
#      simulated replica started here, answering /health and a chat.
#
# Needs root (mmdebstrap's root mode, buildah's chroot) and the Debian packages
# mmdebstrap and buildah (installed if missing, like scripts/setup-browser.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "$(id -u)" != 0 ]]; then
  echo "test-image: SKIPPED: mmdebstrap's root mode and buildah's chroot isolation need root"
  exit 0
fi
VENV="${VENV:-.venv}"
WORK="$(mktemp -d /tmp/prefixgate-image.XXXXXX)"
WHEELS=".image-wheels"
B=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
pids=()
ctr=""
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [[ -n "$ctr" ]] && "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true
  "${B[@]}" rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$WORK" "$WHEELS"
}
trap cleanup EXIT

need=()
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
if (( ${#need[@]} )); then
  echo "test-image: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

echo "test-image: base image from Debian packages (mmdebstrap)"
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-venv,python-is-python3,ca-certificates,passwd \
  bookworm "$WORK/base.tar"
base=$("${B[@]}" from scratch)
root=$("${B[@]}" mount "$base")
tar -C "$root" -xf "$WORK/base.tar"
"${B[@]}" umount "$base" >/dev/null
"${B[@]}" commit --quiet "$base" localhost/prefixgate-base:bookworm >/dev/null
"${B[@]}" rm "$base" >/dev/null

echo "test-image: wheels for an offline image build"
# async-timeout: redis needs it below Python 3.11.3, and Debian bookworm's is 3.11.2 (this
# venv's Python may be newer, so pip would not fetch it from the dependency markers).
"$VENV/bin/pip" wheel --quiet --wheel-dir "$WHEELS" . "setuptools>=64" wheel \
  "async-timeout>=4.0.3" 2>&1 \
  | grep -v "^WARNING: Location" || true

echo "test-image: buildah bud (chroot isolation, vfs storage)"
"${B[@]}" bud --quiet --isolation chroot --layers=false \
  --build-arg BASE=localhost/prefixgate-base:bookworm --build-arg WHEELS="$WHEELS" \
  -t localhost/prefixgate:test . >/dev/null

free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
sim_port=$(free_port)
gw_port=$(free_port)
"$VENV/bin/python" -m engine.sim --port "$sim_port" --served-model-name sim-model \
  --time-scale 50 --log-level warning &
pids+=($!)

echo "test-image: the gateway from the image's root filesystem"
ctr=$("${B[@]}" from --quiet localhost/prefixgate:test)
"${B[@]}" run --isolation chroot "$ctr" -- sh -c 'python -c "import policies._blocktable, gateway._relay" \
  && echo "test-image: the compiled block table and stream relay are in the image"'
"${B[@]}" run --isolation chroot "$ctr" -- prefixgate serve --host 127.0.0.1 \
  --port "$gw_port" --replica "http://127.0.0.1:$sim_port" --model sim-model \
  >"$WORK/gateway.log" 2>&1 &
pids+=($!)

for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$gw_port/ready" >/dev/null && break
  sleep 0.5
done
if ! curl -sf "http://127.0.0.1:$gw_port/health" >/dev/null; then
  echo "test-image: the image's gateway does not answer /health:" >&2
  cat "$WORK/gateway.log" >&2
  exit 1
fi
reply=$(curl -sf "http://127.0.0.1:$gw_port/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model": "sim-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}')
echo "$reply" | "$VENV/bin/python" -c '
import json, sys
reply = json.load(sys.stdin)
assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["content"], reply
print("test-image: the image'"'"'s gateway answered /health and a chat:",
      repr(reply["choices"][0]["message"]["content"]))'
