"""Strategies side by side: `compare(configs) -> Comparison`.

Each RunConfig is launched in turn (a progress bar per run), checked against a single-process run of
the same model, seed and batch (one per distinct model among them), and summarised in one row of
`Comparison.table`: strategy, world size, median step time, tokens/s, achieved FLOP/s and utilisation
against the machine's measured peak, peak memory per category, bytes moved per step, bubble fraction,
loss difference from the baseline — and the estimate (workbench.predict.estimator)
beside each measurement with its error.

    cmp = workbench.compare([RunConfig(dp=2, model="tiny", steps=4), RunConfig(dp=2, zero=3, steps=4)])
    cmp.table; cmp.bars(); cmp.timelines(); cmp.memory(); cmp.report("traces/compare")
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.intervals import step_spread
from workbench.analysis.run import Run
from workbench.config import RunConfig, ValidConfig, validated
from workbench.launching.launcher import launch
from workbench.predict import formulas
from workbench.predict.estimator import Hardware, estimate, with_emulated_links
from workbench.trace.recorder import MEMORY_CATEGORIES as CATEGORIES
from workbench.viz.palette import MEMORY_COLORS, span_color
from workbench.viz.timeline import span_kinds


def strategy_name(c: RunConfig) -> str:
    parts = [
        f"{axis}{getattr(c, axis)}" for axis in ("dp", "tp", "pp") if getattr(c, axis) > 1
    ] or ["1 process"]
    if c.zero:
        parts.append(f"zero{c.zero}")
    if c.pp > 1:
        parts.append(f"{c.schedule} m{c.microbatches}")
    elif c.microbatches > 1:
        parts.append(f"accum{c.microbatches}")
    if c.sequence_parallel:
        parts.append("sp")
    if c.precision != "fp32":
        parts.append(c.precision)
    if c.recompute != "none":
        parts.append(f"recompute-{c.recompute}")
    return " ".join(parts)


@dataclass(kw_only=True)
class Comparison:
    runs: dict[str, Run]
    baseline: Run  # the first configuration's single-process run
    table: pd.DataFrame
    baselines: list[Run] = field(default_factory=list)  # one per distinct model, batch and seed

    def bars(self) -> go.Figure:
        """Measured and estimated step time, each ± its spread: the measured steps' (10th to 90th
        percentile), the calibration's (how much this machine moved while it was measured)."""
        t = self.table

        def err(col: str) -> dict:
            return {"type": "data", "array": list(1e3 * t[col].fillna(0.0)), "visible": True}

        fig = go.Figure(
            [
                go.Bar(
                    x=t.strategy,
                    y=1e3 * t.step_time_s,
                    name="measured",
                    error_y=err("step_time_spread_s"),
                ),
                go.Bar(
                    x=t.strategy,
                    y=1e3 * t.predicted_step_time_s,
                    name="estimated",
                    error_y=err("predicted_step_time_spread_s"),
                ),
            ]
        )
        fig.update_layout(
            barmode="group",
            yaxis_title="median step time (ms), ± spread",
            title="step time per strategy, each ± its spread",
        )
        return fig

    def timelines(self) -> go.Figure:
        """Each run's last step, rank 0's compute and communication, on one time axis."""
        names, shown = list(self.runs), set()
        fig = make_subplots(
            rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.05
        )
        for i, name in enumerate(names, start=1):
            ev = self.runs[name].events
            step = ev.step.max()
            ev = ev[(ev.step == step) & (ev["rank"] == 0) & (ev.cat != "step")]
            t0 = ev.start_us.min()
            ev = ev.assign(cat=span_kinds(ev))
            for cat, g in ev.groupby("cat"):
                fig.add_trace(
                    go.Bar(
                        y=g.lane,
                        x=g.dur_us / 1e3,
                        base=(g.start_us - t0) / 1e3,
                        orientation="h",
                        name=cat,
                        legendgroup=cat,
                        showlegend=cat not in shown,
                        marker_color=span_color(cat),
                    ),
                    row=i,
                    col=1,
                )
                shown.add(cat)
        fig.update_layout(
            barmode="overlay",
            height=200 * len(names),
            title="rank 0, last step, one time axis (ms)",
        )
        return fig

    def memory(self) -> go.Figure:
        """Rank 0's categories at the moment their sum peaked (the stack's height is what the rank pays at
        once, `peak_total_bytes`), beside the estimate of that simultaneous total. Stacking each category's
        own peak would overstate it: activations peak mid-step, gradients and optimizer states later."""
        fig = go.Figure()
        for cat in CATEGORIES:
            col = f"at_peak_{cat}_bytes"
            if self.table[col].any():
                fig.add_trace(
                    go.Bar(
                        x=self.table.strategy,
                        y=self.table[col] / 1e6,
                        name=cat,
                        marker_color=MEMORY_COLORS[cat],
                    )
                )
        fig.add_trace(
            go.Scatter(
                x=self.table.strategy,
                y=self.table.predicted_memory_bytes / 1e6,
                mode="markers",
                marker={"symbol": "x", "size": 12, "color": "black"},
                name="estimated total",
            )
        )
        fig.update_layout(
            barmode="stack",
            yaxis_title="MB, rank 0, at its simultaneous peak",
            title="memory per rank: each category at the moment their total peaked",
        )
        return fig

    def report(self, out_dir: str) -> str:
        """Write table.csv and report.html (opens without Jupyter or network: report.html_page); return
        the report's path."""
        from workbench.viz.report import html_page

        os.makedirs(out_dir, exist_ok=True)
        self.table.to_csv(os.path.join(out_dir, "table.csv"), index=False)
        path = os.path.join(out_dir, "report.html")
        with open(path, "w") as f:
            f.write(
                html_page(
                    "Strategies side by side",
                    [
                        ("measured beside estimated", self.table),
                        ("step time", self.bars()),
                        ("memory per rank", self.memory()),
                        ("timelines", self.timelines()),
                    ],
                )
            )
        return path


def _row(name: str, run: Run, base: Run, hw: Hardware | None) -> dict:
    c = RunConfig.from_dict(_request(run))
    s = run.summary
    r0 = s["ranks"][0]
    step = (
        float(run.metrics.step_time_s.iloc[1:].median())
        if len(run.metrics) > 1
        else s["step_time_s"]
    )
    steps = list(run.metrics.step_time_s.iloc[1:]) if len(run.metrics) > 1 else [step]
    tokens = c.global_batch * c.model_config.seq_len
    flops = formulas.model_flops_per_token(c.model_config) * tokens
    est = estimate(
        c,
        hardware=with_emulated_links(hw, c) if hw else None,
        backend_copies=run.config.get("backend") == "gloo",
    )
    # the simultaneous peak of every category: what the rank pays
    measured_mem = r0["peak_total_bytes"]
    row = {
        "strategy": name,
        "world_size": c.world_size,
        "step_time_s": step,
        "tokens_per_s": tokens / step,
        "achieved_flops": flops / step,
        "utilisation": flops / step / (hw.peak_flops * c.world_size) if hw else None,
        **{f"peak_{k}_bytes": r0["peak_bytes"].get(k, 0) for k in CATEGORIES},
        "peak_total_bytes": measured_mem,
        **{f"at_peak_{k}_bytes": r0.get("bytes_at_peak_total", {}).get(k, 0) for k in CATEGORIES},
        "bytes_moved_per_step": r0["bytes_moved_per_step"],
        "bubble_fraction": (s.get("bubble_fraction") or {}).get("measured"),
        "loss_diff_vs_baseline": float((run.metrics.loss - base.metrics.loss).abs().max()),
        "step_time_spread_s": step * step_spread(steps),
        "predicted_step_time_s": est.step_time_s,
        "step_time_dominant_term": est.dominant_term,
        "predicted_step_time_spread_s": est.step_time_spread_s,
        "step_time_error": (est.step_time_s - step) / step if est.step_time_s else None,
        "predicted_memory_bytes": est.memory_bytes_per_rank,
        "memory_error": (est.memory_bytes_per_rank - measured_mem) / measured_mem,
    }
    return row


def _request(run: Run) -> dict:
    with open(os.path.join(run.path, "request.json")) as f:
        return json.load(f)


def baseline_config(c: RunConfig) -> RunConfig:
    """The single process that `c` must equal: the same model, data, seed, global batch, optimizer settings
    and steps, in fp32, with no parallelism, compression, offload, emulated link, fault or checkpoint."""
    return c.replace(
        dp=1,
        tp=1,
        pp=1,
        zero=0,
        microbatches=1,
        virtual_stages=1,
        sequence_parallel=False,
        precision="fp32",
        grad_reduce_dtype="fp32",
        recompute="none",
        grad_compression="none",
        optimizer="adamw",
        allreduce="backend",
        offload_optimizer=False,
        emulate_link=None,
        ranks_per_node=0,
        node_placement="block",
        fault=None,
        checkpoint_every=0,
        checkpoint_dir=None,
        resume=None,
        max_restarts=0,
        elastic=False,
        name=None,
    )


def compare(
    configs: Sequence[RunConfig],
    out_dir: str = os.path.join("traces", "compare"),
    *,
    hardware: Hardware | None = None,
    progress: bool = True,
    force: bool = False,
) -> Comparison:
    """Launch each configuration, and one single-process baseline per distinct model, batch and seed among
    them (`baseline_config`), so that each row's `loss_diff_vs_baseline` is its distance from one process
    training the same model (runs already in `out_dir` are replaced only with `force`). Every config and
    baseline is validated once, before the first launch (a ValidConfig is taken as it is)."""
    valid = [validated(c) for c in configs]
    base_of: dict[str, ValidConfig] = {}
    keys = []
    for c in valid:
        base_cfg = baseline_config(c)
        keys.append(key := json.dumps(base_cfg.to_dict(), sort_keys=True, default=str))
        if key not in base_of:  # a config that is its own baseline is not validated again
            base_of[key] = c if base_cfg == c else base_cfg.validate()
    baselines: dict[str, Run] = {}
    for key, base in base_of.items():
        where = "baseline" if not baselines else f"baseline{len(baselines)}"
        baselines[key] = launch(base, os.path.join(out_dir, where), progress=progress, force=force)
    runs: dict[str, Run] = {}
    for i, c in enumerate(valid):
        name = strategy_name(c)
        if name in runs:
            name = f"{name} ({i})"
        runs[name] = launch(c, os.path.join(out_dir, f"run{i}"), progress=progress, force=force)
    table = pd.DataFrame(
        [_row(n, r, baselines[k], hardware) for (n, r), k in zip(runs.items(), keys, strict=True)]
    )
    # what the estimates were made with, beside the runs (calibrate(out=) wrote it)
    if hardware is not None:
        from workbench.studies.calibration import FILE, load_calibration, save_calibration

        path = os.path.join(out_dir, FILE)
        if not os.path.exists(path) or load_calibration(path) != hardware:
            save_calibration(hardware, out_dir)
    return Comparison(
        runs=runs, baseline=baselines[keys[0]], table=table, baselines=list(baselines.values())
    )
