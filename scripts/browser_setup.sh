#!/usr/bin/env bash
# What `make test-browser` needs beyond `make setup`: Debian's chromium (Playwright cannot download its
# own browsers here; it is launched by its path) and Playwright's Python package.
set -euo pipefail
VENV=${1:-.venv}
CHROMIUM=${WORKBENCH_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  echo "[browser] installing chromium (apt-get)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
"$VENV/bin/python" -m pip install --quiet -e ".[browser]"
echo "[browser] ready: $("$CHROMIUM" --version 2>/dev/null || echo "chromium at $CHROMIUM"), playwright $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("playwright"))')"
