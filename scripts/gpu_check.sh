#!/usr/bin/env bash
# The checks that need a GPU, shaped for one call of a borrowed machine with NVIDIA GPUs (no network: nothing is
# fetched, the checkout goes on PYTHONPATH and the machine's torch is used): the headline first (gpt2-small bf16,
# ours with fast steps beside the plain loop, eager then compiled), then the fast-path and one-GPU cases, the rest as
# time allows — each section under its own bound, the whole within TOTAL_S=480 s on one H100, the summary table
# rewritten under $OUT after every section, so a cut call still returns what finished. scripts/gpu_check.py says
# what each section runs; docs/guide/gpus.md what a call returns.
#   bash scripts/gpu_check.sh              # on the GPU machine (carry .whl/: scripts/gpu_wheels.sh fills it here)
#   bash scripts/gpu_check.sh --rehearse   # here, on the CPU: every section's command at tiny sizes (make test runs it)
# PY: the python that holds torch (python3); PEAK_TFLOPS for a GPU predict/hardware.py does not know.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--rehearse" ]; then
  exec "${PY:-.venv/bin/python}" scripts/gpu_check.py "$@"
fi
exec "${PY:-python3}" scripts/gpu_check.py "$@"
