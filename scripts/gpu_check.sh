#!/usr/bin/env bash
# The checks that need a GPU, as one script (for a borrowed GPU machine): the NCCL path, CUDA memory
# accounting against torch.cuda.memory_allocated, and step timing against DDP.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
python3 -m pip install -q -e . pytest 2>&1 | tail -1
nvidia-smi -L
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
python3 -m pytest -q tests/test_cuda.py 2>&1 | tee "$OUT/cuda_tests.log"
python3 -m workbench.cli run --dp 1 --backend nccl --model small --steps 20 --out "$OUT/nccl_small" --quiet \
    2>&1 | tee "$OUT/nccl_small.log"
python3 -c "
import json; s = json.load(open('$OUT/nccl_small/summary.json'))['ranks'][0]
print('peak by category', s['peak_bytes']); print('allocator peak', s.get('allocator_peak_bytes'))
print('step time', s['step_time_s'])" 2>&1 | tee -a "$OUT/nccl_small.log"
