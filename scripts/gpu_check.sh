#!/usr/bin/env bash
# The checks that need a GPU, as one script for a machine with NVIDIA GPUs — a borrowed one too, with no
# network: nothing is fetched, the checkout goes on PYTHONPATH and the machine's torch is used. Every section
# runs under its own time bound (a section cut short is reported as such); with the defaults the whole
# script ends within 8 minutes on one GPU. It ends with ONE summary table (scripts/gpu_summary.py):
#   1. the GPU acceptance suite (make test-gpu: every strategy on NCCL on as many GPUs as there are; on one
#      GPU: one GPU equal to one CPU process, ZeRO-Offload, recomputation, fp16, resume, the fused AdamW,
#      a fast step's synchronisations against a plain loop's, the measure schedules, compiled blocks);
#   2. ours against a plain PyTorch loop (benchmarks/ours_vs_plain.py): gpt2-small at batch 16×1024 and
#      gpt-1.3b at 8×1024, bf16, sdpa, eager and compiled — tokens/s and MFU of our fast steps, of our
#      measured steps and of the plain loop, and ours/plain with its interval;
#   3. one CLI run of gpt2-small (the launch path: the progress line's MFU, summary.json's mfu and
#      measure_cost, doctor's view of the GPU through NVML);
#   4. every notebook under nbmake.
# Carry .whl/ (scripts/gpu_wheels.sh fills it here): the GPU image lacks tyro (the CLI of section 3) and Jupyter.
#   5. with two GPUs or more, our data parallelism against DDP on NCCL.
# Bounds (seconds): SUITE_LIMIT_S=90, BENCH_LIMIT_S=70 (eager), COMPILED_LIMIT_S=100 (compiled),
# RUN_LIMIT_S=40, NB_LIMIT_S=100; 0 = no bound. GPU_TESTS_K selects suite cases (pytest -k); BIG_EAGER=1
# adds gpt-1.3b eager (its goals are compiled); SKIP_1_3B=1 leaves gpt-1.3b out. PEAK_TFLOPS for a GPU
# predict/hardware.py does not know. Everything printed is kept under $OUT (default /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
PY=${PY:-python3}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rm -f "$OUT/bench.jsonl" "$OUT/sections.tsv"
bounded() { local limit=$1; shift; timeout "$limit" "$@"; }
section() {  # name, exit status: one row of sections.tsv (124 = cut at its bound)
  local rc=$2 state=passed
  if [ "$rc" -eq 124 ]; then state="cut at its bound"; elif [ "$rc" -ne 0 ]; then state="FAILED (exit $rc)"; fi
  printf '%s\t%s\n' "$1" "$state" >> "$OUT/sections.tsv"
}
nvidia-smi -L | tee "$OUT/gpus.txt"
NGPU=$(nvidia-smi -L | wc -l)
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA'; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'NCCL', torch.cuda.nccl.version())" || exit 1

if compgen -G ".whl/*.whl" >/dev/null; then  # the CLI's and the notebooks' packages, carried as wheels
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

echo "== 1. the GPU acceptance suite on $NGPU GPU(s)"
bounded "${SUITE_LIMIT_S:-90}" "$PY" -m pytest -q -rs -m gpu --durations=8 -p no:cacheprovider \
    ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} tests/gpu 2>&1 | tee "$OUT/test_gpu.log"
section suite "${PIPESTATUS[0]}"

echo "== 2. ours against a plain PyTorch loop (the same GPT, nanoGPT's way)"
bench() {  # label, bound, model, batch, extra flags
  local label=$1 limit=$2 model=$3 batch=$4; shift 4
  WB_BENCH_JSON="$OUT/bench.jsonl" bounded "$limit" "$PY" benchmarks/ours_vs_plain.py --backend nccl --model "$model" \
      --global-batch "$batch" --precision bf16 --attention sdpa --rounds 10 --warmup 2 "$@" 2>&1 \
      | grep -v "^W" | tee "$OUT/bench_$label.log"
  section "bench $label" "${PIPESTATUS[0]}"
}
bench gpt2-small "${BENCH_LIMIT_S:-70}" gpt2-small 16
bench gpt2-small-compiled "${COMPILED_LIMIT_S:-100}" gpt2-small 16 --compile
if [ -z "${SKIP_1_3B:-}" ]; then
  [ -n "${BIG_EAGER:-}" ] && bench gpt-1.3b "${BENCH_LIMIT_S:-70}" gpt-1.3b 8
  bench gpt-1.3b-compiled "${COMPILED_LIMIT_S:-100}" gpt-1.3b 8 --compile
fi

echo "== 3. one run through the CLI: gpt2-small, progress with MFU, summary.json, doctor (NVML)"
bounded "${RUN_LIMIT_S:-40}" "$PY" -m workbench.cli run --model gpt2-small --precision bf16 --attention sdpa \
    --backend nccl --global-batch 16 --lr 3e-4 --steps 12 --out "$OUT/gpt2-small" --force 2>&1 | tail -3 \
    | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
section "cli run" "$rc"
if [ "$rc" -eq 0 ]; then
  "$PY" -m workbench.cli doctor "$OUT/gpt2-small" 2>&1 | tail -4 | tee -a "$OUT/run.log"
  cp "$OUT/gpt2-small/summary.json" "$OUT/run_summary.json"
  tar -czf "$OUT/gpt2_small_run.tgz" -C "$OUT" gpt2-small && rm -rf "$OUT/gpt2-small"
fi

echo "== 4. every notebook (nbmake)"
if "$PY" -c "import nbmake, ipykernel, plotly, ipywidgets" 2>/dev/null; then
  # the notebooks name setup's "workbench" kernel, which a bare GPU image lacks: ipykernel's own python3 runs them
  bounded "${NB_LIMIT_S:-100}" "$PY" -m pytest -q -p no:cacheprovider --nbmake --nbmake-kernel=python3 notebooks 2>&1 \
    | tee "$OUT/notebooks.log"
  section notebooks "${PIPESTATUS[0]}"
else
  echo "not run: Jupyter's packages are missing here (run scripts/gpu_wheels.sh where PyPI is reachable, carry .whl)" \
    | tee "$OUT/notebooks.log"
  printf 'notebooks\tnot run (no Jupyter packages: carry .whl)\n' >> "$OUT/sections.tsv"
fi

echo "== 5. our data parallelism against DDP on NCCL"
if [ "$NGPU" -ge 2 ]; then
  bounded "${BENCH_LIMIT_S:-70}" "$PY" benchmarks/dp_vs_ddp.py --backend nccl --ranks "$NGPU" --model small \
      --global-batch $(( 8 * NGPU )) --bucket-mb 25 --rounds 20 2>&1 | grep -v "^W" | tee "$OUT/dp_vs_ddp.log"
  section "dp vs ddp" "${PIPESTATUS[0]}"
else
  echo "one GPU: data parallelism needs two (not run)" | tee "$OUT/dp_vs_ddp.log"
fi

"$PY" scripts/gpu_summary.py "$OUT" "$(( $(date +%s) - START ))" | tee "$OUT/summary.txt"
! grep -q "FAILED" "$OUT/sections.tsv"
