#!/usr/bin/env bash
# Run HERE (a machine with PyPI), before a GPU session: the wheels the borrowed GPU machine lacks — the CLI's
# (tyro and its two needs) and the notebooks' (nbmake, Jupyter's kernel and client, ipywidgets, plotly) —,
# for its Python 3.12 on x86-64, into .whl/ (git-ignored). scripts/gpu_check.sh installs them there into
# /tmp/site when .whl/ is carried (the device tool: carry [".whl"]). The GPU image already holds torch,
# numpy, pandas, pytest, pygments, packaging, typing-extensions, narwhals, attrs, psutil and tensorboard;
# these are the rest, at the versions the project's own venv runs.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PKGS=(nbmake==1.5.5 nbclient==0.11.0 nbformat==5.11.1 jupyter_client==8.10.0 jupyter_core==5.9.1
      ipykernel==7.4.0 ipython==9.18.1 ipython_pygments_lexers==1.1.1 traitlets==5.16.1 pyzmq==27.3.0
      tornado==6.6.1 comm==0.2.3 debugpy==1.8.22 matplotlib-inline==0.2.2 nest-asyncio2==1.7.4 jedi==0.20.1
      parso==0.8.7 prompt_toolkit==3.0.53 wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0
      stack-data==0.6.3 executing==2.3.0 asttokens==3.0.2 pure_eval==0.2.4 fastjsonschema==2.22.3
      jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
      platformdirs==4.14.9 ipywidgets==8.1.9 widgetsnbextension==4.0.16 jupyterlab_widgets==3.0.17
      plotly==7.1.0 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
for pkg in "${PKGS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d .whl "$pkg"
done
du -sh .whl
