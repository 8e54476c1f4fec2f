"""Checkpoint save and load, measured: time and bytes per rank against the model-state formula.

    python benchmarks/checkpoint_cost.py [--model small] [--dp 2] [--zero 3] [--repeats 3]

Runs a training run that checkpoints (`checkpoint_every`), then resumes from that checkpoint, `repeats`
times, and reads the `checkpoint` spans of every rank's trace: the bytes each rank wrote must be its share
of the sharded model states (12Ψ/N for fp32 AdamW under ZeRO-3; for plain data parallelism the replicated
states are written once in all, by whichever rank DCP picks), not a full copy per rank. Prints the
median save and load time per rank, its bytes, and the write bandwidth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import workbench as wb
from workbench.engine.checkpoint.files import verify


def spans(run: wb.Run, prefix: str) -> dict[int, dict]:
    return {
        t["workbench"]["rank"]: e
        for t in run.traces
        for e in t["traceEvents"]
        if e.get("cat") == "checkpoint" and e["name"].startswith(prefix)
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="small")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--zero", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    saves: dict[int, list[float]] = {}
    loads: dict[int, list[float]] = {}
    written: dict[int, int] = {}
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.repeats):
            base = wb.RunConfig(model=a.model, dp=a.dp, zero=a.zero, global_batch=8, steps=2)
            first = wb.launch(
                base.replace(checkpoint_every=2), out=os.path.join(d, f"save{i}"), progress=False
            )
            path = os.path.join(first.path, "checkpoints", "step_000002")
            marker = verify(path)
            resumed = wb.launch(
                base.replace(steps=3, resume=path), out=os.path.join(d, f"load{i}"), progress=False
            )
            for r, e in spans(first, "checkpoint save").items():
                saves.setdefault(r, []).append(e["dur"] / 1e6)
                written[r] = e["args"]["bytes"]
            for r, e in spans(resumed, "checkpoint load").items():
                loads.setdefault(r, []).append(e["dur"] / 1e6)
        psi = first.config["params"]
    share = 12 * psi / (a.dp if a.zero else 1)
    print(
        f"{a.model}: Ψ = {psi:,}; dp={a.dp} zero={a.zero}; fp32 AdamW model states 12Ψ = {12 * psi:,} bytes"
    )
    print(
        f"checkpoint: {marker['bytes']:,} bytes in files, {marker['tensor_bytes']:,} of tensors "
        f"({marker['tensor_bytes'] / (12 * psi):.3f} × 12Ψ)"
    )
    print(
        f"{'rank':>4} {'save s':>8} {'load s':>8} {'bytes written':>14} {'12Ψ/N':>12} {'ratio':>6} {'MB/s':>7}"
    )
    for r in sorted(saves):
        s, ld = statistics.median(saves[r]), statistics.median(loads.get(r, [float("nan")]))
        print(
            f"{r:>4} {s:>8.3f} {ld:>8.3f} {written[r]:>14,} {share:>12,.0f} {written[r] / share:>6.3f} "
            f"{written[r] / s / 1e6:>7.1f}"
        )


if __name__ == "__main__":
    main()
