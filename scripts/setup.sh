#!/usr/bin/env bash
# Create the virtual environment with everything workbench needs (used by `make setup`).
#
# torch: a machine that already has torch keeps it (the venv sees the system's packages); otherwise
# a machine with an NVIDIA GPU gets PyPI's default (CUDA) build, and any other machine gets the CPU
# build of torch 2.13.0 — never a multi-GB CUDA build on a machine without a GPU.
# WORKBENCH_TORCH=cuda forces the CUDA build where no GPU is visible yet (a Docker build for GPUs).
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${PYTHON:-python3}
WANT=${WORKBENCH_TORCH:-auto}

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "[setup] torch $("$PYTHON" -c 'import torch; print(torch.__version__)') found: the venv will use it"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PIP=("$VENV/bin/python" -m pip install --quiet)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if [ "$WANT" = cuda ] || { [ "$WANT" = auto ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "[setup] NVIDIA GPU found and no torch: installing PyPI's torch (CUDA build)"
    "${PIP[@]}" torch
  else
    echo "[setup] no GPU and no torch: installing torch==2.13.0 (CPU build)"
    # A local CPU wheel (pip's find-links) first; else PyTorch's CPU index.
    "${PIP[@]}" "torch==2.13.0+cpu" 2>/dev/null \
      || "${PIP[@]}" "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
"${PIP[@]}" -e ".[dev]"
# NVML's bindings where there is an NVIDIA GPU: each CUDA rank reads its GPU's health (measure/gpu_health.py)
if [ "$WANT" = cuda ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  "${PIP[@]}" -e ".[gpu]"
fi
# JupyterLab saves the widgets' state with the notebook: a saved notebook reopens with its sliders and charts
# instead of "Error displaying widget: model not found" (the setting's default is off).
mkdir -p "$VENV/share/jupyter/lab/settings"
echo '{"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": true}}' > "$VENV/share/jupyter/lab/settings/overrides.json"
# The notebooks name the kernel "workbench": installed into the venv itself (--sys-prefix), which Jupyter run from
# the venv prefers to a user-wide kernel of that name (one left by another clone could point at a deleted venv).
"$VENV/bin/python" -m ipykernel install --sys-prefix --name workbench --display-name "Python (workbench)" >/dev/null
"$VENV/bin/python" -c "import torch, workbench; print(f'[setup] ready: torch {torch.__version__}, workbench {workbench.__version__}, CUDA available: {torch.cuda.is_available()}')"
