"""What the `workbench` subcommands do (cli/parser.py parses): run, compare, show, report.

Exit codes: 0 done, 1 a run failed (or `show` found an unfinished run), 2 bad input (a configuration, a
directory that is not a run, an earlier run that --force would replace), 130 interrupted (Ctrl-C,
SIGTERM or SIGHUP: torchrun and its ranks are stopped, and what they wrote stays).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from workbench.cli.run_command import parse_run
from workbench.config import ConfigError, ModelConfig, RunConfig


def shown_config(config: RunConfig) -> dict[str, Any]:
    """The settings a run prints before it starts: those that differ from RunConfig's defaults (the whole
    resolved configuration is config.json, and `--print-config` prints it)."""
    defaults = RunConfig().to_dict()
    return {k: v for k, v in config.to_dict().items() if v != defaults.get(k)}


def absolute_csv(schedule: str) -> str:
    """csv:FILE with FILE made absolute: every rank (and every later reader of config.json) finds it."""
    return f"csv:{os.path.abspath(schedule[4:])}" if schedule.startswith("csv:") else schedule


def cmd_schedule(a: argparse.Namespace) -> int:
    """`workbench schedule show|export`: the schedule as data, validated, without starting a process."""
    from workbench.schedules.build import (
        build_schedule,
        peak_in_flight,
        peak_pending_w,
        simulate,
        validate,
    )
    from workbench.schedules.torch_csv import write_csv

    try:
        s = build_schedule(a.schedule, a.pp, a.microbatches, a.virtual_stages)
    except ValueError as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 2
    if errors := validate(s):
        print("workbench: invalid schedule: " + "; ".join(errors), file=sys.stderr)
        return 1
    if a.action == "show":
        t = simulate(s, 1.0, 2.0, t_w=1.0)
        print(s.grid())
        print(
            f"bubble rate at T_F = T_I = T_W: {t.bubble_rate():.4f}; activations in flight per rank "
            f"{peak_in_flight(s)}; weight-gradient stashes per rank {peak_pending_w(s)}"
        )
        return 0
    if a.format == "json":
        text = json.dumps(s.to_dict(), indent=1)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text)
        else:
            print(text)
        return 0
    if a.out:
        write_csv(s, a.out)
    else:
        print(
            "\n".join(
                ",".join(str(x) for x in acts if x.kind in ("F", "B", "I", "W"))
                for acts in s.actions
            )
        )
    return 0


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled like Ctrl-C (the launcher stops torchrun and its ranks)."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(f"signal {signum}")


def cmd_run(argv: list[str]) -> int:
    """`workbench run ARGS`: parse (cli/run_command.py), validate, print the settings or launch."""
    from workbench.config.files import config_text
    from workbench.launching.launcher import Nodes, RunFailed, default_run_dir, launch

    try:
        config, a = parse_run(argv)
        config = config.replace(schedule=absolute_csv(config.schedule)).validate()
    except ConfigError as e:
        print(f"workbench: invalid configuration: {e}", file=sys.stderr)
        return 2
    if a.print_config:
        print(config_text(config), end="")
        return 0
    changed = " ".join(
        f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}"
        for k, v in shown_config(config).items()
    )
    print(
        f"settings (beside the defaults; all of them: --print-config, and config.json): {changed or 'none'}",
        flush=True,
    )
    if isinstance(config.model, ModelConfig):  # given as changes to a preset: the dims that result
        print(f"model: {config.model_config}", flush=True)
    nodes = Nodes(nnodes=a.nnodes, node_rank=a.node_rank, rdzv_endpoint=a.rdzv_endpoint)
    out = a.out or default_run_dir(config)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        run = launch(
            config,
            out,
            progress=not a.quiet,
            nodes=nodes,
            force=a.force,
            launcher=a.launcher,
            ray_address=a.ray_address,
            check_disk=a.check_disk,
            check_memory=a.check_memory,
        )
    except (ConfigError, FileExistsError) as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"workbench: run failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        why = f"stopped by {e}" if isinstance(e, Stopped) else "interrupted"
        print(
            f"\nworkbench: {why} — {a.launcher} and its ranks were stopped; partial results in {out}/ "
            f"(workbench show {out})",
            file=sys.stderr,
        )
        return 130
    print_summary(run.path)
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from workbench.studies.comparison import compare

    configs = []
    try:
        for text in a.configs:
            if os.path.exists(text):
                with open(text) as f:
                    text = f.read()
            configs.append(RunConfig.from_dict(json.loads(text)).validate())
    except (ConfigError, json.JSONDecodeError) as e:
        print(f"workbench: invalid configuration: {e}", file=sys.stderr)
        return 2
    hw = None
    if not a.no_calibrate:
        from workbench.studies.calibration import calibrate

        worlds = tuple(sorted({max(2, c.world_size + c.world_size % 2) for c in configs}))
        print(
            f"calibrating this machine for {max(worlds)} ranks (a few minutes: short runs, three of each; "
            f"--no-calibrate skips it) ...",
            file=sys.stderr,
            flush=True,
        )
        # the runs' own model, batch, backend and device; written to OUT/calibration.json
        hw = calibrate(
            configs[0].model,
            global_batch=configs[0].global_batch,
            backend=configs[0].backend,
            worlds=worlds,
            out=a.out,
        )
    try:
        result = compare(configs, a.out, hardware=hw, force=a.force)
    except FileExistsError as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 2
    print(result.table.to_string(index=False))
    print(
        f"\nreport: {result.report(a.out)}  (opens in a browser, no Jupyter needed); table: {a.out}/table.csv"
    )
    if a.wandb:
        from workbench.engine.logs.wandb_log import log_table

        log_table(
            a.wandb, a.out, f"compare-{os.path.basename(os.path.abspath(a.out))}", result.table
        )
        print(
            f"W&B: the table logged to project {a.wandb!r} (offline runs: wandb sync {a.out}/wandb/offline-run-*)"
        )
    return 0


def cmd_merge(run_dir: str) -> int:
    """Rebuild trace.json (and any rank trace its stream still holds): 0, or 1 naming a file that stays damaged."""
    from workbench.trace.merge import DamagedTrace, rebuild

    if not os.path.isdir(run_dir):
        print(f"workbench: no run directory at {run_dir}", file=sys.stderr)
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


def cmd_show(run_dir: str) -> int:
    """A finished run's summary (0); an unfinished one's steps, errors and files (1); no run (2)."""
    from workbench.analysis.run import load

    if not os.path.isdir(run_dir):
        print(f"workbench: no run directory at {run_dir}", file=sys.stderr)
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


def cmd_report(run_dir: str, out: str | None) -> int:
    if not os.path.isdir(run_dir):
        print(f"workbench: no run directory at {run_dir}", file=sys.stderr)
        return 2
    from workbench.viz.report import write_run_report

    print(f"report: {write_run_report(run_dir, out)}  (one file, opens in any browser)")
    return 0


def print_summary(run_dir: str) -> None:
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
