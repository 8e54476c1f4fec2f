"""`Run`: one run directory read back as pandas DataFrames (no torch, no torch.distributed).

run = workbench.load("traces/demo")
run.metrics    # one row per optimizer step: step, loss, lr, grad_norm, step_time_s, tokens, tokens_per_s
run.events     # one row per span: rank, lane, name, cat, start_us, dur_us, end_us, step, op, group, ...
run.memory     # one row per memory counter: rank, ts_us, and a column per category
run.summary    # summary.json as a dict
run.config     # config.json as a dict
run.recoveries # the nodes it lost and recovered from, with the detection and recovery times
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from typing import Any

import pandas as pd

from workbench.analysis.recovery import Recovery, recoveries
from workbench.config import RunConfig
from workbench.trace.merge import load_traces
from workbench.trace.recorder import LANES
from workbench.trace.spans import spans

_LANE_NAMES = {tid: name for name, tid in LANES.items()}
_ARG_COLUMNS = (
    "step",
    "microbatch",
    "stage",
    "chunk",
    "layer",
    "op",
    "group",
    "seq",
    "peer",
    "bytes",
    "label",
    "algorithm",
    "phase",
    "ring_step",
    "send_chunk",
    "recv_chunk",
    "recv_peer",
    "chunks",
    "recv_bytes",
    "algbw_GBps",
    "busbw_GBps",
    "async",
    "link",
    "seconds",
    "emulated_s",
    "emulated_link",
    "block_of",
    "pairs",
)


class Run:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"no run directory at {path}")

    def __repr__(self) -> str:
        status = self.summary.get("status", "no summary") if self.summary else "no summary"
        return f"Run({self.path!r}, world_size={self.config.get('world_size')}, status={status})"

    def _json(self, name: str) -> dict[str, Any]:
        path = os.path.join(self.path, name)
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            return json.load(f)

    @cached_property
    def config(self) -> dict[str, Any]:
        return self._json("config.json") or self._json("request.json")

    @property
    def run_config(self) -> RunConfig:
        """The RunConfig this run was launched with (config.json's resolved facts left out): relaunch it
        with `wb.launch(run.run_config.replace(...))`."""
        return RunConfig.from_dict(self._json("request.json") or self.config)

    @cached_property
    def summary(self) -> dict[str, Any]:
        return self._json("summary.json")

    @cached_property
    def errors(self) -> list[dict[str, Any]]:
        out = []
        for name in sorted(os.listdir(self.path)):
            if name.startswith("error_rank") and name.endswith(".json"):
                out.append(self._json(name))
        return out

    @cached_property
    def recoveries(self) -> list[Recovery]:
        """The nodes this run lost and recovered from: when each was lost, detected, the group re-formed
        and its first step done (analysis/recovery.py)."""
        return recoveries(self.path)

    @cached_property
    def metrics(self) -> pd.DataFrame:
        path = os.path.join(self.path, "metrics.jsonl")
        if not os.path.exists(path):
            return pd.DataFrame(
                columns=["step", "loss", "lr", "grad_norm", "step_time_s", "tokens", "tokens_per_s"]
            )
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return pd.DataFrame(rows)

    @cached_property
    def traces(self) -> list[dict[str, Any]]:
        return load_traces(self.path)

    @cached_property
    def events(self) -> pd.DataFrame:
        """Spans (complete events) and async operations (begin/end joined), one row each."""
        rows = []
        for trace in self.traces:
            rank = trace["distributedInfo"]["rank"]
            rows += [
                _row(rank, e, start, dur, kind)
                for e, start, dur, kind in spans(trace["traceEvents"])
            ]
        df = pd.DataFrame(rows)
        if not df.empty:
            df = df.sort_values(["rank", "start_us"], kind="stable").reset_index(drop=True)
        return df

    def _counters(self, name: str) -> list[dict]:
        """Every rank's counter events of `name`, as rows: rank, ts_us and the counter's values."""
        return [
            {"rank": t["distributedInfo"]["rank"], "ts_us": e["ts"], **e["args"]}
            for t in self.traces
            for e in t["traceEvents"]
            if e.get("ph") == "C" and e["name"] == name
        ]

    @cached_property
    def memory(self) -> pd.DataFrame:
        return pd.DataFrame(self._counters("memory"))

    @cached_property
    def allocator(self) -> pd.DataFrame:
        """What the allocator held at the snapshots it was read (CUDA; CPU with --profile-memory): rank,
        ts_us (the same as the `memory` row it belongs to), allocated (and on CUDA max_allocated,
        reserved)."""
        rows = self._counters("allocator")
        return pd.DataFrame(rows, columns=None if rows else ["rank", "ts_us", "allocated"])

    @cached_property
    def allocator_peak(self) -> pd.DataFrame:
        """The CPU allocator's true peak of the profiled step (--profile-memory): rank, ts_us, allocated,
        backend_threads, after_snapshot_us (the snapshot whose categories held then)."""
        rows = self._counters("allocator_peak")
        return pd.DataFrame(rows, columns=None if rows else ["rank", "ts_us", "allocated"])

    @cached_property
    def flows(self) -> pd.DataFrame:
        """Flow events (send → receive links): rank, ph ('s' or 'f'), id, cat, ts_us, lane."""
        rows = []
        for trace in self.traces:
            rank = trace["distributedInfo"]["rank"]
            for e in trace["traceEvents"]:
                if e.get("ph") in ("s", "f"):
                    rows.append(
                        {
                            "rank": rank,
                            "ph": e["ph"],
                            "id": e["id"],
                            "cat": e["cat"],
                            "ts_us": e["ts"],
                            "lane": _LANE_NAMES.get(e["tid"], e["tid"]),
                        }
                    )
        return pd.DataFrame(rows)


def _row(rank: int, e: dict[str, Any], ts: float, dur: float, kind: str) -> dict[str, Any]:
    args = e.get("args", {})
    row = {
        "rank": rank,
        "lane": _LANE_NAMES.get(e["tid"], e["tid"]),
        "name": e["name"],
        "cat": e["cat"],
        "start_us": ts,
        "dur_us": dur,
        "end_us": ts + dur,
        "kind": kind,
    }
    for key in _ARG_COLUMNS:
        row[key] = args.get(key)
    return row


def load(path: str) -> Run:
    """Read a run directory written by `launch` (or by torchrun directly)."""
    return Run(path)
