"""One row per completed communication operation of a run, with its size and bandwidth.

Launch spans of asynchronous operations are left out (their async begin/end row carries the whole
operation), as are the individual ring steps (the ring's all-reduce row carries them).
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.run import Run


def collectives(run: Run) -> pd.DataFrame:
    ev = run.events
    if ev.empty:
        return ev
    ops = ev[ev.cat.isin(["collective", "p2p"]) & (ev["async"] != True)]  # noqa: E712 - NaN-safe
    cols = [
        "rank",
        "step",
        "op",
        "group",
        "seq",
        "label",
        "algorithm",
        "bytes",
        "start_us",
        "dur_us",
        "algbw_GBps",
        "busbw_GBps",
        "kind",
    ]
    return ops[cols].reset_index(drop=True)


def bandwidth_by_size(run: Run, label_prefix: str = "bucket") -> pd.Series:
    """Median bus bandwidth (GB/s) of the operations whose label starts with `label_prefix`, by size."""
    c = collectives(run)
    c = c[c.label.fillna("").str.startswith(label_prefix)]
    return c.groupby("bytes").busbw_GBps.median()
