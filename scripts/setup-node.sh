#!/usr/bin/env bash
# The official Node `openai` client for tests/integration/test_node_openai.py, from the npm
# registry at the version package-lock.json pins. Idempotent: skipped while node_modules
# matches the lock file.
set -euo pipefail
cd "$(dirname "$0")/../tests/node"
if ! command -v npm >/dev/null 2>&1; then
  echo "setup-node: npm not found; the Node client test will skip"
  exit 0
fi
stamp="node_modules/.prefixgate-lock"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
echo "setup-node: installed $(node -p 'require("./node_modules/openai/package.json").version') of openai for Node $(node --version)"
