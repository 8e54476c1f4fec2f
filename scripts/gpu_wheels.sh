#!/usr/bin/env bash
# Run HERE (a machine with PyPI), before a GPU session: the wheels the borrowed GPU machine lacks — the CLI's
# (tyro and its two needs; the notebooks no longer run there: scripts/gpu_check.py runs only what uses the GPU) —,
# for its Python 3.12 on x86-64, into .whl/ (git-ignored). scripts/gpu_check.sh installs them there into
# /tmp/site when .whl/ is carried (the device tool: carry [".whl"]). The GPU image already holds torch,
# numpy, pandas, pytest, pygments, packaging, typing-extensions, narwhals, attrs, psutil and tensorboard;
# these are the rest, at the versions the project's own venv runs.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PKGS=(tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
for pkg in "${PKGS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d .whl "$pkg"
done
du -sh .whl
