"""The subcommands that read a run directory and start nothing: validate, show, doctor, merge, report.

    workbench validate traces/dp2        # check the traces against docs/run-format.md
    workbench show traces/dp2            # the summary: step time, overlap, memory measured vs predicted
    workbench doctor traces/dp2          # why it failed: the first cause, who was behind at which collective
    workbench merge traces/dp2           # trace.json rebuilt from the rank traces (a rank's from its stream)
    workbench report traces/dp2          # its charts in one HTML file: traces/dp2/report.html

Exit codes: 0 done, 1 a problem found (invalid traces, an unfinished run, a damaged trace), 2 no run there.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_run_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="where the HTML goes (default RUN/report.html)")


def _no_run_dir(run_dir: str) -> bool:
    """Whether `run_dir` is missing (said on standard error)."""
    if os.path.isdir(run_dir):
        return False
    print(f"workbench: no run directory at {run_dir}", file=sys.stderr)
    return True


def validate(a: argparse.Namespace) -> int:
    """Each problem the run format check finds, then a verdict: 0 valid, 1 not."""
    from workbench.trace.validate import validate_run

    errors = validate_run(a.run_dir)
    for e in errors:
        print(e)
    print(f"{a.run_dir}: {'valid' if not errors else f'{len(errors)} problem(s)'}")
    return 1 if errors else 0


def doctor(a: argparse.Namespace) -> int:
    """Why a run failed (analysis/doctor.py)."""
    from workbench.analysis.doctor import diagnose

    print(diagnose(a.run_dir))
    return 0


def merge(a: argparse.Namespace) -> int:
    """Rebuild trace.json (and any rank trace its stream still holds): 0, or 1 naming a file that stays damaged."""
    from workbench.trace.merge import DamagedTrace, rebuild

    run_dir: str = a.run_dir
    if _no_run_dir(run_dir):
        return 2
    try:
        recovered, merged = rebuild(run_dir)
    except DamagedTrace as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 1
    if recovered:
        print(
            f"rank trace(s) rebuilt from their streams: {', '.join(f'rank {r}' for r in recovered)}"
        )
    print(f"merged: {merged}" if merged else f"{run_dir} holds no rank traces to merge")
    return 0


def show(a: argparse.Namespace) -> int:
    """A finished run's summary (0); an unfinished one's steps, errors and files (1); no run (2)."""
    from workbench.analysis.run import load

    run_dir: str = a.run_dir
    if _no_run_dir(run_dir):
        return 2
    if not any(os.path.exists(os.path.join(run_dir, n)) for n in ("request.json", "config.json")):
        print(f"workbench: {run_dir} is not a workbench run (no request.json)", file=sys.stderr)
        return 2
    from workbench.trace.merge import damaged_traces

    damaged = damaged_traces(run_dir)
    if os.path.exists(os.path.join(run_dir, "summary.json")):
        print_summary(run_dir)
        for problem in damaged:
            print(f"damaged: {problem}")
        return 1 if damaged else 0
    for problem in damaged:
        print(f"damaged: {problem}")
    run = load(run_dir)
    m = run.metrics
    print(
        f"{run_dir}: this run did not finish (no summary.json); {len(m)} step(s) recorded"
        + (f", loss {m.loss.iloc[0]:.4f} → {m.loss.iloc[-1]:.4f}" if len(m) else "")
    )
    for e in sorted(run.errors, key=lambda e: (e.get("secondary", False), e.get("time", 0)))[:3]:
        print(f"  rank {e['rank']}: {e['type']}: {e['message'][:300]}")
    print("files: " + ", ".join(sorted(os.listdir(run_dir))))
    print(f"why it stopped: workbench doctor {run_dir}")
    return 1


def report(a: argparse.Namespace) -> int:
    """The run's charts in one HTML file (viz/report.py)."""
    if _no_run_dir(a.run_dir):
        return 2
    from workbench.viz.report import write_run_report

    print(f"report: {write_run_report(a.run_dir, a.out)}  (one file, opens in any browser)")
    return 0


def print_summary(run_dir: str) -> None:
    """A finished run's summary: its loss and step time, each rank's time split and memory, its files."""
    from workbench.analysis.run import load

    run = load(run_dir)
    m = run.metrics
    if len(m):
        print(
            f"steps {len(m)}: loss {m.loss.iloc[0]:.4f} → {m.loss.iloc[-1]:.4f}; "
            f"median step {m.step_time_s.median() * 1e3:.1f} ms"
        )
    excluded = max((r.get("steps_excluded", 0) for r in run.summary.get("ranks", [])), default=0)
    if excluded:
        print(
            f"(times below leave out the first {excluded} step(s): warm-up — --warmup-steps-excluded)"
        )
    for r in run.summary.get("ranks", []):
        pk, pr = r["peak_bytes"], r["predicted_bytes"]
        mem = ", ".join(f"{k} {pk.get(k, 0) / 1e6:.3f}/{pr[k] / 1e6:.3f} MB" for k in pr)
        print(
            f"rank {r['rank']}: compute {r['compute_s']:.3f}s, comm {r['comm_s']:.3f}s "
            f"({r['overlap_s']:.3f}s under compute), idle {r['idle_s']:.3f}s; measured/predicted: {mem}"
        )
    files = [
        f
        for f in ("metrics.jsonl", "summary.json", "trace.json")
        if os.path.exists(os.path.join(run_dir, f))
    ]
    files += (
        ["trace_rank*.json"] if any(f.startswith("trace_rank") for f in os.listdir(run_dir)) else []
    )
    print(f"\nresults in {run_dir}/ : {', '.join(files)}")
    print("open trace.json at https://ui.perfetto.dev (Open trace file), or in Jupyter:")
    print(
        f"  import workbench as wb; run = wb.load({run_dir!r}); from workbench import viz; viz.timeline(run)"
    )
