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
# gpt2-small on every GPU of the machine as dp × tp (tp 2 where there are at least 2), bf16, fused attention:
# tokens/s and MFU — model FLOPs utilisation: 6·Ψ·tokens/s (+ attention's 12·L·s·h per token) over the
# GPUs' peak (H100/H200 bf16 dense: 989 TFLOP/s each; set PEAK_TFLOPS for another GPU).
NGPU=$(nvidia-smi -L | wc -l); TP=$(( NGPU >= 2 ? 2 : 1 )); DP=$(( NGPU / TP ))
python3 -m workbench.cli run --model gpt2-small --dp "$DP" --tp "$TP" --precision bf16 --attention sdpa \
    --global-batch $(( 8 * DP )) --lr 6e-4 --steps 12 --out "$OUT/gpt2_small" --force --quiet 2>&1 | tail -5 \
    | tee "$OUT/gpt2_small.log"
PEAK_TFLOPS=${PEAK_TFLOPS:-989} NGPU=$NGPU python3 - "$OUT/gpt2_small" <<'PY' 2>&1 | tee -a "$OUT/gpt2_small.log"
import json, os, sys
import pandas as pd
from workbench.model_config import PRESETS
run = sys.argv[1]
m = PRESETS["gpt2-small"]
rows = pd.read_json(os.path.join(run, "metrics.jsonl"), lines=True).iloc[2:]  # warm-up left out
tps = rows.tokens_per_s.median()
flops_per_token = 6 * m.param_count() + 12 * m.layers * m.seq_len * m.hidden
mfu = flops_per_token * tps / (float(os.environ["PEAK_TFLOPS"]) * 1e12 * int(os.environ["NGPU"]))
print(f"gpt2-small: {tps:,.0f} tokens/s, MFU {mfu:.1%} over {os.environ['NGPU']} GPU(s)")
PY
