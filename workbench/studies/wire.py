"""Communication measured on a real wire: a local cluster's tbf-shaped links (launching/local_cluster.py),
every time taken by the clock and every byte read from the shaper's own counter (`link_bytes`).

    link_fit(cluster)                 α and β of a 2-rank all-reduce across the link (2 nodes × 1 rank)
    measure_run(cluster, config)      a training run across the cluster: each step's gradient all-reduce,
                                      timed from the trace, and the bytes that left node 0 a step
    dp_against_rate(cluster, ...)     DP's all-reduce against the link rate, beside bytes / rate + α
    allreduce_schemes(cluster, ...)   the hierarchical all-reduce against the flat ring (2 nodes × 2 ranks)
    placements(cluster, ...)          tp inside a node against tp across the link (2 nodes × 2 ranks)

What a step's gradient all-reduce costs (`sync_seconds`): from the moment the last rank entered it to the
moment the last rank left it, read from the trace's spans (the ranks share this machine's clock). With one
bucket (bucket_mb above the model's gradients) the all-reduce starts when backward is over: nothing
overlaps it, so this is its whole time, none of it hidden, and no rank's lateness counts in it.

Latency is the kernel's, never shaped: `netem` is not available on this kind of machine, so α here is
what the veth pair, the bridge and gloo cost (about 0.1 ms), not a network's. tbf's token bucket lets a
short burst through at the machine's speed (launching/local_cluster.set_rate: 1 ms of traffic, at least
32 KiB): a message of a few kilobytes crosses unshaped, and α is measured there; β is fitted where the
bucket is a small share of the message.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from workbench.analysis.collectives import collectives
from workbench.analysis.run import Run
from workbench.config import RunConfig, ValidConfig, validated
from workbench.launching.launcher import launch
from workbench.launching.local_cluster import LocalCluster
from workbench.predict.formulas import node_link_bytes
from workbench.studies.comm_calibration import alpha_beta
from workbench.studies.wire_timing import WireTimes, link_bytes, wire_times

#: the sizes α is measured on: the token bucket passes them whole
SMALL_SIZES = (1 << 10, 1 << 12)
#: a size the shaper paces: at least 1 MiB and 8 token buckets (the bucket then speeds it by under 1/8)
LARGE = 1 << 20


def fit_sizes(rate_mbit: float | None) -> tuple[int, ...]:
    """The sizes `link_fit` measures at `rate_mbit`: SMALL_SIZES, then 8 and 32 token buckets (≥ 1 and
    4 MiB)."""
    large = max(LARGE, int(8 * _burst(rate_mbit)))
    return (*SMALL_SIZES, large, 4 * large)


def _burst(rate_mbit: float | None) -> float:
    """tbf's bucket on the cluster's links (local_cluster.set_rate): 1 ms of traffic, at least 32 KiB."""
    return max((rate_mbit or 0) * 1e6 / 8 / 1000, 32 * 1024)


@dataclass(kw_only=True)
class LinkFit:
    """t(S) = α + S/β for a 2-rank all-reduce of S bytes across the link (each rank sends S), on each
    size's fastest repeat: α the small sizes' (median), β the slope through the large ones;
    `wire_factor` the bytes the shaper charged per byte of payload at the large sizes (headers: Ethernet,
    IP, TCP, and the acknowledgements of the other way's data)."""

    rate_mbit: float | None
    alpha_s: float
    beta_Bps: float
    wire_factor: float
    times: WireTimes

    @property
    def beta_over_rate(self) -> float:
        """The payload's bandwidth over the shaper's rate: under 1 by the headers."""
        return self.beta_Bps * 8 / (self.rate_mbit * 1e6) if self.rate_mbit else float("nan")

    def seconds(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.beta_Bps


def link_fit(
    cluster: LocalCluster, *, sizes: Sequence[int] | None = None, repeats: int = 6
) -> LinkFit:
    """α and β across `cluster`'s link at its current rate (2 nodes × 1 rank, up), by the clock: α from
    the sizes up to 4 KiB, β the slope through those of 8 token buckets or more."""
    if cluster.world_size != 2 or cluster.nodes != 2:
        raise ValueError(f"link_fit needs 2 nodes × 1 rank; cluster {cluster.name!r} is not")
    sizes = tuple(sizes or fit_sizes(cluster.rate_mbit))
    large_at = max(LARGE, 8 * _burst(cluster.rate_mbit))
    small = [s for s in sizes if s <= SMALL_SIZES[-1]]
    large = [s for s in sizes if s >= large_at]
    if not small or len(large) < 2:
        raise ValueError(
            f"sizes {list(sizes)}: at least one of ≤ {SMALL_SIZES[-1]} bytes (α) and two of ≥ "
            f"{large_at:.0f} (β: 8 token buckets at {cluster.rate_mbit} Mbit/s)"
        )
    times = wire_times(cluster, sizes=sizes, repeats=repeats)
    # each size's fastest repeat: a shared machine only ever adds to a call (a wake-up of the other rank
    # costs up to a few ms here, more than α itself), the link's cost is in every one
    fastest = {s: min(t) for s, t in times.seconds.items()}
    _, beta = alpha_beta({s: fastest[s] for s in large}, 2)
    return LinkFit(
        rate_mbit=cluster.rate_mbit,
        alpha_s=statistics.median(fastest[s] for s in small),
        beta_Bps=beta,
        wire_factor=statistics.median(times.shaped_bytes[s] / s for s in large)
        if cluster.rate_mbit
        else float("nan"),
        times=times,
    )


@dataclass(kw_only=True)
class WireRun:
    """A training run across a cluster, as the wire saw it."""

    label: str
    run: Run
    rate_mbit: float | None
    #: each measured step's gradient all-reduce (seconds; the first `skip` steps left out)
    sync_s: list[float]
    #: each measured step's length
    step_s: list[float]
    #: bytes node 0's shaper let out, a step (the run's start-up, about 15 KB, included)
    wire_bytes: float
    #: bytes of the gradient all-reduce's buffer a step (the trace's)
    grad_bytes: float
    #: each group's blocking communication a step: the median rank's sum of its spans, then the median step
    comm_s: dict[str, float] = field(default_factory=dict)

    @property
    def sync(self) -> float:
        return statistics.median(self.sync_s)

    @property
    def step(self) -> float:
        return statistics.median(self.step_s)


def sync_seconds(run: Run, *, prefix: str = "bucket", skip: int = 1) -> dict[int, float]:
    """Each step's gradient all-reduce (every operation whose label starts with `prefix`: a bucket's, or
    the three phases of a hierarchical one), from the last rank's first start to the last rank's last end;
    the first `skip` steps (warm-up) left out."""
    ops = collectives(run)
    ops = ops[ops.label.fillna("").str.startswith(prefix) & (ops.step >= skip)]
    out = {}
    for step, d in ops.groupby("step"):
        ends = (d.start_us + d.dur_us).groupby(d["rank"]).max()
        starts = d.start_us.groupby(d["rank"]).min()
        out[int(step)] = float(ends.max() - starts.max()) / 1e6
    return out


def group_seconds(run: Run, *, skip: int = 1) -> dict[str, float]:
    """Each group's blocking communication a step: per rank and step the sum of its operations' spans,
    the median rank, the median step."""
    ops = collectives(run)
    ops = ops[ops.step >= skip]
    per = ops.groupby(["group", "step", "rank"]).dur_us.sum() / 1e6
    by_step = per.groupby(["group", "step"]).median()
    return {str(g): float(v) for g, v in by_step.groupby("group").median().items()}


def measure_run(
    cluster: LocalCluster, config: RunConfig | ValidConfig, *, out: str, label: str = ""
) -> WireRun:
    """Launch `config` across `cluster` (its shape) and read node 0's shaper before and after."""
    before = link_bytes(cluster, 0)
    run = launch(config, out=out, cluster=cluster, progress=False, force=True)
    sent = link_bytes(cluster, 0) - before
    steps = len(run.metrics)
    skip = min(1, steps - 1)
    ops = collectives(run)
    grads = ops[(ops["rank"] == 0) & ops.label.fillna("").str.startswith("bucket")]
    first = grads[grads.step == grads.step.min()]
    # a bucket's buffer: its all-reduce's, or the largest of a hierarchical one's phases ("bucket 0 (intra)")
    buffers = first.groupby(first.label.str.replace(r" \(.*\)$", "", regex=True)).bytes.max()
    return WireRun(
        label=label or os.path.basename(out),
        run=run,
        rate_mbit=cluster.rate_mbit,
        sync_s=list(sync_seconds(run, skip=skip).values()),
        step_s=run.metrics.step_time_s.iloc[skip:].tolist(),
        wire_bytes=sent / steps,
        grad_bytes=float(buffers.sum()),
        comm_s=group_seconds(run, skip=skip),
    )


def dp_against_rate(
    cluster: LocalCluster,
    rates: Sequence[float | None],
    config: RunConfig,
    *,
    out: str,
    repeats: int = 1,
) -> pd.DataFrame:
    """For each tbf rate (set live on `cluster`, 2 nodes × 1 rank): α and β fitted there, then `repeats`
    dp runs of `config`: the gradient all-reduce measured beside bytes / rate + α, the bytes those of the
    shaper. An unshaped link (None) is measured with nothing to compare it to."""
    rows = []
    for rate in rates:
        cluster.set_rate(rate)
        fit = link_fit(cluster, repeats=5) if rate else None
        for i in range(repeats):
            w = measure_run(cluster, config, out=os.path.join(out, f"dp-{rate}-{i}"))
            row = {
                "rate (Mbit/s)": rate,
                "repeat": i,
                "gradient bytes (trace)": w.grad_bytes,
                "bytes on the wire (shaper)": w.wire_bytes,
                "measured all-reduce (ms)": 1e3 * w.sync,
                "fastest step's all-reduce (ms)": 1e3 * min(w.sync_s),
                "slowest (ms)": 1e3 * max(w.sync_s),
                "step (ms)": 1e3 * w.step,
            }
            if fit is not None and rate:
                predicted = w.wire_bytes * 8 / (rate * 1e6) + fit.alpha_s
                row |= {
                    "bytes / rate + α (ms)": 1e3 * predicted,
                    "error": (w.sync - predicted) / predicted,
                    "α (µs)": 1e6 * fit.alpha_s,
                    "fitted β / rate": fit.beta_over_rate,
                    "wire bytes per payload byte": fit.wire_factor,
                }
            rows.append(row)
    return pd.DataFrame(rows)


def allreduce_schemes(
    cluster: LocalCluster,
    config: RunConfig,
    *,
    out: str,
    schemes: Sequence[str] = ("ring", "hierarchical"),
    repeats: int = 1,
) -> pd.DataFrame:
    """`config` (a dp run over every rank of `cluster`) with each all-reduce scheme, interleaved `repeats`
    times: the gradient all-reduce measured, the bytes node 0's link carried out, and the formula's bytes
    per node link (predict.formulas.node_link_bytes) at the link's rate."""
    rows = []
    for i in range(repeats):
        for scheme in schemes:
            c = replace(validated(config), allreduce=scheme)
            w = measure_run(cluster, c, out=os.path.join(out, f"{scheme}-{i}"), label=scheme)
            formula = node_link_bytes(
                w.grad_bytes, c.dp, cluster.ranks_per_node, scheme == "hierarchical"
            )
            rows.append(
                {
                    "scheme": scheme,
                    "repeat": i,
                    "measured all-reduce (ms)": 1e3 * w.sync,
                    "step (ms)": 1e3 * w.step,
                    "bytes out of node 0 (shaper)": w.wire_bytes,
                    "formula's bytes per node link": formula,
                    "formula bytes / rate (ms)": 1e3 * formula * 8 / (cluster.rate_mbit or 1) / 1e6,
                    "run": w.run.path,
                }
            )
    return pd.DataFrame(rows)


def placements(
    cluster: LocalCluster,
    config: RunConfig,
    *,
    out: str,
    repeats: int = 1,
) -> pd.DataFrame:
    """`config` (dp × tp over every rank of `cluster`) placed in blocks (torchrun's order: each tp group
    inside a node) and round-robin (each tp group across the link), interleaved `repeats` times: the
    step, each group's communication, and the bytes node 0's link carried out."""
    rows = []
    for i in range(repeats):
        for placement in ("block", "round-robin"):
            c = replace(
                validated(config), node_placement=placement, ranks_per_node=cluster.ranks_per_node
            )
            w = measure_run(cluster, c, out=os.path.join(out, f"{placement}-{i}"), label=placement)
            tp_nodes = {w.run.config["hosts"][r] for r in range(c.tp)}
            rows.append(
                {
                    "placement": placement,
                    "tp group": "across the link" if len(tp_nodes) > 1 else "inside a node",
                    "repeat": i,
                    "step (ms)": 1e3 * w.step,
                    "tp communication a step (ms)": 1e3 * w.comm_s.get("tp", 0.0),
                    "dp communication a step (ms)": 1e3 * w.comm_s.get("dp", 0.0),
                    "bytes out of node 0 a step (shaper)": w.wire_bytes,
                    "bytes / rate (ms)": 1e3 * w.wire_bytes * 8 / (cluster.rate_mbit or 1) / 1e6,
                    "run": w.run.path,
                }
            )
    return pd.DataFrame(rows)
