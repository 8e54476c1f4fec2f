"""How good is a what-if? Run each source configuration, edit its trace into a target configuration
(workbench.what_if), run the target too, and compare: the fixed held-out set below, chosen before the
what-if was tuned and kept as it is.

    python benchmarks/what_if_accuracy.py                 # the 12 pairs, 3 rounds
    python benchmarks/what_if_accuracy.py --rounds 1 --only 0,1

Every run (sources and targets) is launched `--rounds` times, interleaved (a slow minute of this 2-core
machine falls on different runs); calibrate() first measures this machine's fixed cost per layer and how
ranks share its cores (what a what-if of dp or microbatches needs: a tiny model's micro-batch is mostly
fixed cost); the prediction is the median of the what-ifs from each round's source,
the measurement the median of the target's rounds (each the median step after the first). Losses are
checked first: each target's against one process's with the same global batch (a straggler's or an
emulated link's too: they change the time only). Goal: mean |error| ≤ 10 % over the set; Kendall's τ
between the predicted and measured order of the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

BASE = {"model": {"base": "tiny", "layers": 4}, "global_batch": 16, "steps": 8, "backend": "gloo"}
SOURCES = {
    "dp2": {"dp": 2},
    "tp2": {"tp": 2},
    "pp2 1f1b m4": {"pp": 2, "microbatches": 4},
    "pp2 gpipe m4": {"pp": 2, "schedule": "gpipe", "microbatches": 4},
}
LINK = {"emulate_link": "inter=0.2,500", "ranks_per_node": 1}
#: (source, what-if changes, the target's own settings): fixed before tuning
PAIRS = [
    ("dp2", {"dp": 4}, {"dp": 4}),
    ("dp2", {"dp": 1}, {}),
    ("tp2", {"dp": 2}, {"dp": 2, "tp": 2}),
    ("pp2 1f1b m4", {"dp": 2}, {"dp": 2, "pp": 2, "microbatches": 4}),
    ("pp2 1f1b m4", {"microbatches": 8}, {"pp": 2, "microbatches": 8}),
    ("pp2 1f1b m4", {"microbatches": 2}, {"pp": 2, "microbatches": 2}),
    ("pp2 1f1b m4", {"schedule": "gpipe"}, {"pp": 2, "schedule": "gpipe", "microbatches": 4}),
    (
        "pp2 gpipe m4",
        {"schedule": "interleaved", "virtual_stages": 2},
        {"pp": 2, "schedule": "interleaved", "virtual_stages": 2, "microbatches": 4},
    ),
    ("dp2", {"bucket_mb": 0.05}, {"dp": 2, "bucket_mb": 0.05}),
    ("dp2", LINK, {"dp": 2, **LINK}),
    ("pp2 1f1b m4", LINK, {"pp": 2, "microbatches": 4, **LINK}),
    (
        "dp2",
        {"straggler": (1, 0.02)},
        {"dp": 2, "fault": "straggle", "fault_rank": 1, "fault_delay_s": 0.02},
    ),
]


def label(changes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items())


def launch(settings: dict, out: str):
    import workbench as wb

    return wb.launch(
        wb.RunConfig.from_dict({**BASE, **settings}), out=out, progress=False, force=True
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default=None, help="comma-separated pair numbers")
    p.add_argument("--out", default=os.path.join("traces", "what_if_accuracy"))
    p.add_argument("--goal", type=float, default=0.10)
    args = p.parse_args(argv)
    os.environ.setdefault("WORKBENCH_BACKEND", "gloo")
    import workbench as wb
    from workbench.studies.calibration import calibrate

    chosen = [int(i) for i in args.only.split(",")] if args.only else list(range(len(PAIRS)))
    # this machine's fixed cost per layer and how ranks share its cores (reused when already made)
    hw = calibrate(
        wb.RunConfig.from_dict(BASE).model_config,
        global_batch=BASE["global_batch"] // 2,
        backend="gloo",
        out=args.out,
        reuse=True,
    )
    reference = launch({}, os.path.join(args.out, "one_process")).metrics.loss.tolist()
    sources = sorted({PAIRS[i][0] for i in chosen})
    measured: dict[str, list[float]] = {}
    predicted: dict[int, list[float]] = {i: [] for i in chosen}
    replay_errors: list[float] = []
    worst = 0.0
    for k in range(args.rounds):
        for name in sources:
            out = os.path.join(args.out, f"source_{name.replace(' ', '_')}_{k}")
            run = launch(SOURCES[name], out)
            for i in chosen:
                if PAIRS[i][0] == name:
                    w = wb.what_if(out, hardware=hw, **PAIRS[i][1])
                    predicted[i].append(w.predicted_s)
                    replay_errors.append(w.source_replayed_s / w.source_measured_s - 1)
            measured.setdefault(name, []).append(float(run.metrics.step_time_s.iloc[1:].median()))
        for i in chosen:
            run = launch(PAIRS[i][2], os.path.join(args.out, f"target_{i}_{k}"))
            worst = max(
                worst, max(abs(a - b) for a, b in zip(run.metrics.loss, reference, strict=True))
            )
            measured.setdefault(str(i), []).append(float(run.metrics.step_time_s.iloc[1:].median()))
    print(
        f"every target's losses equal one process's within {worst:.1e}; {args.rounds} interleaved rounds; "
        f"the sources' replays within {max(abs(e) for e in replay_errors):.1%} of their measured steps"
    )
    print(
        f"{'#':>2} {'source':<13} {'what if':<40} {'source ms':>9} {'predicted':>9} {'measured':>9} "
        f"{'spread':>13} {'error':>7}"
    )
    rows = []
    for i in chosen:
        src, changes, _ = PAIRS[i]
        pred, meas = (
            statistics.median(predicted[i]) * 1e3,
            statistics.median(measured[str(i)]) * 1e3,
        )
        runs = [t * 1e3 for t in measured[str(i)]]
        rows.append(
            {
                "pair": i,
                "source": src,
                "changes": label(changes),
                "predicted_ms": pred,
                "measured_ms": meas,
                "runs_ms": runs,
                "error": pred / meas - 1,
            }
        )
        print(
            f"{i:>2} {src:<13} {label(changes):<40} {statistics.median(measured[src]) * 1e3:>9.1f} {pred:>9.1f} "
            f"{meas:>9.1f} {min(runs):>6.1f}–{max(runs):<6.1f} {pred / meas - 1:>+7.1%}",
            flush=True,
        )
    mean_abs = statistics.mean(abs(r["error"]) for r in rows)
    print(f"\nmean |error| {mean_abs:.1%} over {len(rows)} pairs (goal ≤ {args.goal:.0%})")
    if len(rows) > 1:
        from workbench.analysis.ranking import order_line

        print(order_line(rows, "targets"))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "what_if.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
