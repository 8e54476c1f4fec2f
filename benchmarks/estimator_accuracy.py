"""How good is the step-time estimate? Calibrate this machine, run a dozen strategies, and print each
one's predicted and measured step time, the error, and the term of the model that dominated.

    python benchmarks/estimator_accuracy.py                    # tiny model with 4 layers, 13 strategies
    python benchmarks/estimator_accuracy.py --only dp2,tp2     # some of them
    python benchmarks/estimator_accuracy.py --model small --steps 6

Calibration (workbench.calibrate: compute rates and fixed costs in one process, α/β and the stretch of
shared cores with 2, 4 and 8 ranks, a one-process run for the step's fixed cost) is written to
OUT/calibration.json. Each strategy then runs for real (gloo, one thread per rank); its measured step
is the median over the steps after the first, and each strategy runs `--repeats` times, interleaved
with the others (this 2-core machine has slow minutes: one run of a strategy alone can be 30 % off
the next); the median of the runs is compared. The goal: |error| ≤ 15 % on every row. Each run's trace is
also replayed (analysis/replay.py: the graph's own consistency check, goal ≤ 5 %), and Kendall's τ says
whether the predicted order of the strategies is the measured one. Every run's
losses are checked against one process (the same training), so the times compared are of one thing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

#: name → the strategy's settings (on top of the model, the global batch and the steps)
STRATEGIES = {
    "dp2": {"dp": 2},
    "dp2 zero1": {"dp": 2, "zero": 1},
    "dp2 zero2": {"dp": 2, "zero": 2},
    "dp2 zero3": {"dp": 2, "zero": 3},
    "dp2 accum2": {"dp": 2, "microbatches": 2},
    "tp2": {"tp": 2},
    "tp2 sp": {"tp": 2, "sequence_parallel": True},
    "pp2 gpipe m4": {"pp": 2, "schedule": "gpipe", "microbatches": 4},
    "pp2 1f1b m4": {"pp": 2, "microbatches": 4},
    "pp2 interleaved v2 m4": {
        "pp": 2,
        "schedule": "interleaved",
        "virtual_stages": 2,
        "microbatches": 4,
    },
    "dp2 tp2": {"dp": 2, "tp": 2},
    "dp2 pp2 m4": {"dp": 2, "pp": 2, "microbatches": 4},
    "3D dp2 tp2 pp2 m4": {"dp": 2, "tp": 2, "pp": 2, "microbatches": 4},
}


def measure_once(
    name: str, settings: dict, base: dict, out: str, k: int
) -> tuple[float, list[float], float]:
    """One run of a strategy: its median step after the first, its losses, and its trace's replay error
    (analysis/replay.py: the replayed step over the measured one, less 1)."""
    import workbench as wb
    from workbench.analysis.execution_graph import build
    from workbench.analysis.replay import replay
    from workbench.trace.merge import load_traces

    config = wb.RunConfig.from_dict({**base, **settings, "name": name.replace(" ", "_")})
    run = wb.launch(
        config, out=os.path.join(out, f"{name.replace(' ', '_')}_{k}"), progress=False, force=True
    )
    replayed = replay(build(load_traces(run.path), run.config))
    return (
        float(run.metrics.step_time_s.iloc[1:].median()),
        run.metrics.loss.tolist(),
        replayed.error,
    )


def predicted(name: str, settings: dict, base: dict, hw) -> dict:
    import workbench as wb
    from workbench.predict.estimator import with_emulated_links

    config = wb.RunConfig.from_dict({**base, **settings})
    est = wb.estimate(config, hardware=with_emulated_links(hw, config))
    return {
        "strategy": name,
        "ranks": config.world_size,
        "predicted_ms": est.step_time_s * 1e3,
        "dominant": est.dominant_term,
        "terms_ms": {k: v * 1e3 for k, v in est.step_terms.items()},
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", default='{"base": "tiny", "layers": 4}', help="a preset or a JSON model"
    )
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--only", default=None, help="comma-separated strategy names")
    p.add_argument("--out", default=os.path.join("traces", "estimator_accuracy"))
    p.add_argument("--goal", type=float, default=0.15)
    p.add_argument(
        "--repeats", type=int, default=3, help="runs of each strategy (the median is compared)"
    )
    args = p.parse_args(argv)
    os.environ.setdefault("WORKBENCH_BACKEND", "gloo")
    import workbench as wb
    from workbench.studies.calibration import calibrate

    model = json.loads(args.model) if args.model.startswith("{") else args.model
    base = {
        "model": model,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "backend": "gloo",
    }
    cfg = wb.RunConfig.from_dict(base).model_config
    t = time.time()
    # calibrated on half the batch: the dp=n runs it makes are not the rows below
    hw = calibrate(cfg, global_batch=args.global_batch // 2, backend="gloo", out=args.out)
    print(
        f"calibrated in {time.time() - t:.0f} s → {os.path.join(args.out, 'calibration.json')}",
        flush=True,
    )
    names = args.only.split(",") if args.only else list(STRATEGIES)
    reference = wb.launch(
        wb.RunConfig.from_dict(base),
        out=os.path.join(args.out, "one_process"),
        progress=False,
        force=True,
    ).metrics.loss.tolist()
    times: dict[str, list[float]] = {n: [] for n in names}
    replays: dict[str, list[float]] = {n: [] for n in names}
    worst = 0.0
    # round-robin: a slow minute of the machine falls on different strategies
    for k in range(args.repeats):
        for name in names:
            t, losses, replay_error = measure_once(name, STRATEGIES[name], base, args.out, k)
            times[name].append(t)
            replays[name].append(replay_error)
            worst = max(worst, max(abs(a - b) for a, b in zip(losses, reference, strict=True)))
    print(
        f"every run's losses equal one process's within {worst:.1e}; each strategy run {args.repeats} times, "
        f"interleaved; measured = the median of their medians (spread: min–max)"
    )
    print(
        f"{'strategy':<24} {'ranks':>5} {'predicted ms':>13} {'measured ms':>12} {'spread':>13} {'error':>8} "
        f"{'replay':>7}  dominant"
    )
    rows = []
    for name in names:
        r = predicted(name, STRATEGIES[name], base, hw)
        r["measured_ms"] = statistics.median(times[name]) * 1e3
        r["runs_ms"] = [t * 1e3 for t in times[name]]
        r["error"] = (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"]
        r["replay_error"] = max(replays[name], key=abs)  # the worst of its runs
        rows.append(r)
        spread = f"{min(r['runs_ms']):.1f}–{max(r['runs_ms']):.1f}"
        print(
            f"{name:<24} {r['ranks']:>5} {r['predicted_ms']:>13.1f} {r['measured_ms']:>12.1f} {spread:>13} "
            f"{r['error']:>+8.1%} {r['replay_error']:>+7.1%}  {r['dominant']}",
            flush=True,
        )
    within = [r for r in rows if abs(r["error"]) <= args.goal]
    print(
        f"\n{len(within)} of {len(rows)} rows within ±{args.goal:.0%}; every run's trace replayed within "
        f"{max(abs(r['replay_error']) for r in rows):.1%} of its measured step (the replay column: its worst run)"
    )
    if len(rows) > 1:
        from workbench.analysis.ranking import order_line

        print(order_line(rows, "strategies"))
    for r in rows:
        if abs(r["error"]) > args.goal:
            print(
                f"  {r['strategy']}: {r['error']:+.1%}; terms (ms) "
                + ", ".join(f"{k} {v:.1f}" for k, v in r["terms_ms"].items() if v > 0.05)
            )
    with open(os.path.join(args.out, "accuracy.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
