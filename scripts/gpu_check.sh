#!/usr/bin/env bash
# The checks that need a GPU, as one script for a machine with NVIDIA GPUs (a borrowed one too). It stops
# at the first failure with a non-zero exit and prints, as it goes:
#   1. the GPU acceptance suite (make test-gpu: every strategy on NCCL on as many GPUs as there are,
#      equality to one GPU, valid traces, bytes counted once, the allocator explained, a pipeline's
#      waits, resume, restart, a hang ending in CommError);
#   2. gpt2-small and gpt-1.3b (bf16, fused attention) as dp × tp over every GPU: tokens/s and MFU
#      (model FLOPs utilisation: (6·Ψ + 12·L·s·h) per token × tokens/s over the GPUs' bf16 dense peak:
#      989 TFLOP/s for an H100/H200; set PEAK_TFLOPS for another GPU);
#   3. our bucketed data parallelism against torch DDP on NCCL: the step-time ratio (losses checked first).
# Everything it prints is also kept under $OUT (default /tmp/gpu_check).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
PY=${PY:-python3}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/gpus.txt"
NGPU=$(nvidia-smi -L | wc -l)
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA'; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
"$PY" -m pip install -q -e ".[dev]" 2>&1 | tail -1 || true   # keeps the machine's torch

echo "== 1. the GPU acceptance suite on $NGPU GPU(s)"
"$PY" -m pytest -q -rs -m gpu tests/gpu 2>&1 | tee "$OUT/test_gpu.log"

throughput() {  # preset, global batch per dp rank
  local model=$1 per=$2 tp dp
  tp=$(( NGPU >= 2 ? 2 : 1 )); dp=$(( NGPU / tp ))
  "$PY" -m workbench.cli run --model "$model" --dp "$dp" --tp "$tp" --precision bf16 --attention sdpa --backend nccl \
      --global-batch $(( per * dp )) --lr 3e-4 --steps 12 --out "$OUT/$model" --force --quiet 2>&1 | tail -3
  PEAK_TFLOPS=${PEAK_TFLOPS:-989} NGPU=$NGPU "$PY" - "$OUT/$model" "$model" <<'PY'
import json, os, sys
import pandas as pd
from workbench.model_config import PRESETS
run, name = sys.argv[1], sys.argv[2]
m = PRESETS[name]
rows = pd.read_json(os.path.join(run, "metrics.jsonl"), lines=True).iloc[2:]  # warm-up left out
tps = rows.tokens_per_s.median()
flops_per_token = 6 * m.param_count() + 12 * m.layers * m.seq_len * m.hidden
mfu = flops_per_token * tps / (float(os.environ["PEAK_TFLOPS"]) * 1e12 * int(os.environ["NGPU"]))
s = json.load(open(os.path.join(run, "summary.json")))["ranks"][0]
print(f"{name}: {tps:,.0f} tokens/s, MFU {mfu:.1%} over {os.environ['NGPU']} GPU(s); rank 0 peak allocated "
      f"{s['allocator_peak_bytes']['allocated'] / 2**30:.2f} GiB, categories' total {s['peak_total_bytes'] / 2**30:.2f} GiB")
PY
}
echo "== 2. throughput"
throughput gpt2-small 8 | tee "$OUT/gpt2_small.log"
throughput gpt-1.3b 2 | tee "$OUT/gpt_1.3b.log"

echo "== 3. our data parallelism against DDP on NCCL"
if [ "$NGPU" -ge 2 ]; then
  "$PY" benchmarks/dp_vs_ddp.py --backend nccl --ranks "$NGPU" --model small --global-batch $(( 8 * NGPU )) \
      --bucket-mb 25 --rounds 20 2>&1 | grep -v "^W" | tee "$OUT/dp_vs_ddp.log"
else
  echo "one GPU: data parallelism needs two (skipped)" | tee "$OUT/dp_vs_ddp.log"
fi
echo "gpu_check: all passed; logs in $OUT"
