#!/usr/bin/env bash
# Create the project's venv and install prefixgate with its test tools.
# Idempotent: a stamp keyed on pyproject.toml, setup.py and the C sources makes
# reruns instant.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
VENV="${VENV:-.venv}"
stamp="$VENV/.prefixgate-installed"
# Keyed on what the install builds from: the metadata, and the compiled modules.
want="$(cat pyproject.toml setup.py policies/_blocktable.c gateway/_relay.c | sha256sum | cut -d' ' -f1)"
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
