#!/usr/bin/env bash
# Create the project's venv and install prefixgate with its test tools.
# Idempotent: a stamp keyed on pyproject.toml makes reruns instant.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
VENV="${VENV:-.venv}"
stamp="$VENV/.prefixgate-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "bootstrap: creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[test]"
echo "$want" > "$stamp"
echo "bootstrap: installed prefixgate into $VENV"
