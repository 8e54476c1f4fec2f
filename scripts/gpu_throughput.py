"""One GPU run's figures, for scripts/gpu_check.sh: tokens/s and MFU measured, the allocator's peak beside
the categories' total, and the estimator's step time (an H100's figures: an H200 has its compute and more
memory bandwidth) beside the measured one.

    python scripts/gpu_throughput.py RUN_DIR        # PEAK_TFLOPS (default 989, H100/H200 bf16 dense)

MFU (model FLOPs utilisation) = (6·Ψ + 12·L·s·h) FLOPs a token × tokens/s ÷ (the GPUs' peak).
"""

from __future__ import annotations

import os
import sys

import workbench as wb
from workbench.predict.hardware import H100_80GB


def main(path: str) -> None:
    run = wb.load(path)
    config = wb.RunConfig.from_dict(run.config)
    m = config.model_config
    rows = run.metrics.iloc[2:]  # the first steps warm up (allocator, cuBLAS heuristics, NCCL)
    tps, step = rows.tokens_per_s.median(), rows.step_time_s.median()
    gpus = run.config["world_size"]
    flops_per_token = 6 * m.param_count() + 12 * m.layers * m.seq_len * m.hidden
    mfu = flops_per_token * tps / (float(os.environ.get("PEAK_TFLOPS", 989)) * 1e12 * gpus)
    r = run.summary["ranks"][0]
    allocated = r.get("allocator_peak_bytes", {}).get("allocated", float("nan"))  # CUDA runs only
    predicted = wb.estimate(config, hardware=H100_80GB).step_time_s
    print(f"{os.path.basename(path)}: {tps:,.0f} tokens/s, step {step * 1e3:.1f} ms, MFU {mfu:.1%} over {gpus} GPU(s); "
          f"estimator (H100 figures) {predicted * 1e3:.1f} ms = {predicted / step:.2f}× measured; rank 0 "
          f"allocator peak {allocated / 2**30:.2f} GiB, categories' total {r['peak_total_bytes'] / 2**30:.2f} GiB, "
          f"unattributed {r.get('unattributed_bytes', float('nan')) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main(sys.argv[1])
