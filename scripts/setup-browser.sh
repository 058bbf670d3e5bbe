#!/usr/bin/env bash
# Tools of the ops-view tests, from Debian packages; idempotent (instant when present):
#   chromium   headless browser for tests/browser (driven over the DevTools protocol)
#   promtool   from the `prometheus` package, checks deploy/prometheus rules and queries
# Installing the `prometheus` package does not start a Prometheus server here
# (no init system in the container; elsewhere stop it if you do not want it).
set -euo pipefail
need=()
[[ -x /usr/bin/chromium ]] || need+=(chromium fonts-liberation)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if (( ${#need[@]} == 0 )); then
  exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  SUDO="sudo"
fi
echo "setup-browser: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
