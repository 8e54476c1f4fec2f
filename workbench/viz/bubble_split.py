"""The summary's split of a run's measured bubble (analysis/bubble.py, summary.json's `bubble_fraction.split`) in
the notebooks' words, as a share of the step and in ms.

The split adds one measured cost at a time to the schedule's simulation, from the formula (equal costs, free
transfers) up to the measured bubble. Its key `uneven_stage_costs` is the schedule simulated with the run's own
mean compute time per (stage, kind) under free transfers, less the formula: it holds stages that differ (the last
one also runs the head and the loss) and, for a zero-bubble schedule, costs other than the formula's T_F = T_I =
T_W (W shorter than I, B not 2F). The notebooks call it "costs ≠ the formula's". 1F1B's formula holds for any
B ÷ F, so for 1F1B the term is the stages' differences alone.

    WORDS            each term's name in the notebooks
    split(run)       {name: share of the step}, in the summary's order (the formula first, unexplained last)
    split_ms(run)    the same in ms: each share × the step's window (from the first compute action of any rank
                     to the last; the mean over the steps after the first, as the split is) — idle time
                     averaged over the ranks
    line(run)        the split as one line of text, shares and ms

Reads a Run's summary and trace only; no torch.
"""

from __future__ import annotations

from workbench.analysis.dualpipe_runs import compute_spans
from workbench.analysis.run import Run

#: summary.json's term → the notebooks' name for it
WORDS = {
    "formula": "formula",
    "uneven_stage_costs": "costs ≠ the formula's",
    "transfers": "transfers",
    "host_gaps": "host gaps",
    "entry_skew": "entry skew",
    "unexplained": "unexplained",
}


def split(run: Run) -> dict[str, float]:
    """The split of the run's measured bubble, each term a share of the step, by its name in `WORDS`."""
    terms = run.summary["bubble_fraction"]["split"]
    return {WORDS[k]: float(terms[k]) for k in WORDS}


def window_ms(run: Run) -> float:
    """The step's window (ms): from the first compute action of any rank to the last, the mean over the
    steps after the first."""
    spans = compute_spans(run)
    per_step = spans.groupby("step").agg(start=("start_us", "min"), end=("end_us", "max"))
    return float((per_step.end - per_step.start).mean()) / 1e3


def split_ms(run: Run) -> dict[str, float]:
    """`split` in ms: each share × `window_ms` (idle time averaged over the ranks)."""
    window = window_ms(run)
    return {k: v * window for k, v in split(run).items()}


def line(run: Run) -> str:
    """'formula 0.077 (19.3 ms), costs ≠ the formula's +0.052 (+13.1 ms), …': each term after the formula
    signed."""
    share, ms = split(run), split_ms(run)
    return ", ".join(
        f"{k} {v:.3f} ({ms[k]:.1f} ms)" if k == "formula" else f"{k} {v:+.3f} ({ms[k]:+.1f} ms)"
        for k, v in share.items()
    )
