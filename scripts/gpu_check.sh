#!/usr/bin/env bash
# The checks that need a GPU, as one script for a machine with NVIDIA GPUs (a borrowed one too, with no
# network: nothing is installed, the checkout is put on PYTHONPATH and the machine's torch is used). Every
# section runs; the script exits non-zero at the end if any failed. It prints, as it goes:
#   1. the GPU acceptance suite (make test-gpu: every strategy on NCCL on as many GPUs as there are,
#      equality to one GPU, valid traces, bytes counted once, the allocator explained, a pipeline's
#      waits, resume, restart, a hang ending in CommError; on one GPU: one GPU equal to one CPU process,
#      ZeRO-Offload, recomputation, fp16 loss scaling, resume — tests/gpu/test_one_gpu.py);
#   2. this machine's compute measured as the calibration measures it (matmul FLOP/s, element-wise bytes/s);
#   3. gpt2-small and gpt-1.3b (bf16, fused attention) as dp × tp over every GPU: tokens/s and MFU
#      (model FLOPs utilisation: (6·Ψ + 12·L·s·h) per token × tokens/s over the GPUs' bf16 dense peak:
#      989 TFLOP/s for an H100/H200; set PEAK_TFLOPS for another GPU), the allocator's peak beside the
#      categories', and the estimator's step time (H100 figures) beside the measured one;
#      gpt2-small once more with nothing traced, the cost of recording; doctor's view of the GPU (NVML);
#   4. our bucketed data parallelism against torch DDP on NCCL: the step-time ratio (losses checked first).
# Everything it prints is also kept under $OUT (default /tmp/gpu_check), with gpt2-small's run (traces too).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
PY=${PY:-python3}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
FAILED=()
# a borrowed machine's time is short: SUITE_LIMIT_S and RUN_LIMIT_S bound the suite and each other section
# (0, the default: no bound); GPU_TESTS_K selects some of the suite's cases (pytest -k); SKIP_1_3B=1 leaves
# gpt-1.3b out
suite() { timeout "${SUITE_LIMIT_S:-0}" "$@"; }
bounded() { timeout "${RUN_LIMIT_S:-0}" "$@"; }
nvidia-smi -L | tee "$OUT/gpus.txt"
NGPU=$(nvidia-smi -L | wc -l)
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA'; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'NCCL', torch.cuda.nccl.version())" || exit 1

echo "== 1. the GPU acceptance suite on $NGPU GPU(s)"
suite "$PY" -m pytest -q -rs -m gpu --durations=12 ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} tests/gpu 2>&1 | tee "$OUT/test_gpu.log" || FAILED+=("suite")

echo "== 2. compute, as the calibration measures it"
bounded "$PY" - <<'PY' 2>&1 | tee "$OUT/compute.log" || FAILED+=("compute")
from workbench.config import PRESETS
from workbench.predict.compute_calibration import measure_compute
for name in ("gpt2-small",):
    c = measure_compute(PRESETS[name], (1, 2, 4), "cuda")
    print(name, {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in c.items()})
PY

throughput() {  # preset, global batch per dp rank
  local model=$1 per=$2 tp dp
  tp=$(( NGPU >= 2 ? 2 : 1 )); dp=$(( NGPU / tp ))
  bounded "$PY" -m workbench.cli run --model "$model" --dp "$dp" --tp "$tp" --precision bf16 --attention sdpa --backend nccl \
      --global-batch $(( per * dp )) --lr 3e-4 --steps 12 --out "$OUT/$model" --force --quiet 2>&1 | tail -3 &&
  "$PY" scripts/gpu_throughput.py "$OUT/$model"
}
echo "== 3. throughput, memory and the estimate"
throughput gpt2-small 8 2>&1 | tee "$OUT/gpt2_small.log" || FAILED+=("gpt2-small")
"$PY" -m workbench.cli doctor "$OUT/gpt2-small" 2>&1 | tail -4 | tee -a "$OUT/gpt2_small.log"  # NVML's view
if [ -z "${SKIP_1_3B:-}" ]; then throughput gpt-1.3b 2 2>&1 | tee "$OUT/gpt_1.3b.log" || FAILED+=("gpt-1.3b"); fi
bounded "$PY" - <<'PY' 2>&1 | tee "$OUT/untraced.log" || FAILED+=("untraced")
import os, tempfile
import workbench as wb
with tempfile.TemporaryDirectory() as d:  # gpt2-small again, one GPU, nothing recorded: what tracing costs
    run = wb.launch(wb.RunConfig(model="gpt2-small", precision="bf16", attention="sdpa", backend="nccl",
                                 global_batch=8, lr=3e-4, steps=12, trace=False), out=os.path.join(d, "r"),
                    progress=False)
    print(f"gpt2-small untraced: step {run.metrics.step_time_s.iloc[2:].median() * 1e3:.1f} ms")
PY
tar -czf "$OUT/gpt2_small_run.tgz" -C "$OUT" gpt2-small && rm -rf "$OUT/gpt2-small" "$OUT/gpt-1.3b" || true

echo "== 4. our data parallelism against DDP on NCCL"
if [ "$NGPU" -ge 2 ]; then
  bounded "$PY" benchmarks/dp_vs_ddp.py --backend nccl --ranks "$NGPU" --model small --global-batch $(( 8 * NGPU )) \
      --bucket-mb 25 --rounds 20 2>&1 | grep -v "^W" | tee "$OUT/dp_vs_ddp.log" || FAILED+=("dp_vs_ddp")
else
  echo "one GPU: data parallelism needs two (not run)" | tee "$OUT/dp_vs_ddp.log"
fi
if [ ${#FAILED[@]} -gt 0 ]; then echo "gpu_check: FAILED: ${FAILED[*]}; logs in $OUT"; exit 1; fi
echo "gpu_check: all passed; logs in $OUT"
