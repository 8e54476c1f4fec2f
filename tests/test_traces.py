"""Every run's traces follow docs/run-format.md, and show what data parallelism does."""

import json

import pytest

import workbench as wb
from workbench.trace.recorder import LANES
from workbench.trace.validate import validate_run, validate_trace

BUCKETS = {"dp": 2, "bucket_mb": 0.01}  # the tiny model's 0.12 MB of gradients in ~12 buckets


@pytest.mark.parametrize(
    "config",
    [
        {"dp": 1},
        BUCKETS,
        {"dp": 2, "allreduce": "ring", "bucket_mb": 0.03},
        pytest.param({"dp": 4}, marks=pytest.mark.slow),
        {"dp": 2, "dp_impl": "naive"},
    ],
)
def test_every_trace_validates(launched, config):
    run = launched(**config)
    assert validate_run(run.path) == []


def test_bucket_all_reduces_overlap_backward(launched):
    ev = launched(**BUCKETS).events
    for rank in (0, 1):
        mine = ev[ev["rank"] == rank]
        backward = mine[mine.cat == "backward"]
        buckets = mine[(mine.kind == "async") & mine.label.fillna("").str.startswith("bucket")]
        assert len(buckets) >= 2 * len(backward), "several buckets per step"
        overlapping = 0
        for _, b in backward.iterrows():
            inside = buckets[(buckets.step == b.step) & (buckets.start_us < b.end_us)]
            overlapping += len(inside)
        # every bucket but the last is launched while backward is still running
        assert overlapping >= len(buckets) - len(backward)


def test_every_collective_has_op_bytes_group_seq(launched):
    ev = launched(**BUCKETS).events
    comm = ev[ev.cat == "collective"]
    assert len(comm) > 0
    assert comm[["op", "bytes", "group", "seq"]].notna().all().all()
    # seq joins one collective across ranks: the same (seq → op, bytes) on both ranks
    keyed = comm[comm.kind == "async"].groupby("seq")[["op", "bytes"]].nunique()
    assert (keyed == 1).all().all()


def test_memory_counters_carry_every_category(launched):
    mem = launched(**BUCKETS).memory
    cats = {
        "parameter",
        "gradient",
        "optimizer_state",
        "activation",
        "comm_buffer",
        "temporary",
        "other",
    }
    assert cats <= set(mem.columns)
    assert mem.activation.max() > 0 and mem.optimizer_state.max() > 0


def test_ring_run_has_ring_steps_and_flows(launched):
    run = launched(dp=2, allreduce="ring", bucket_mb=0.03)
    ev = run.events
    ring = ev[ev.cat == "ring_step"]
    assert len(ring) > 0 and set(ring.lane) == {"ring"}
    assert set(ring.phase) == {"reduce_scatter", "all_gather"}
    assert ring[["send_chunk", "recv_chunk", "peer", "recv_peer", "bytes"]].notna().all().all()
    flows = run.flows[run.flows.cat == "ring"]
    starts, ends = flows[flows.ph == "s"], flows[flows.ph == "f"]
    assert len(starts) == len(ends) == len(ring)
    # a flow starts on one rank and ends on the other
    joined = starts.merge(ends, on="id", suffixes=("_send", "_recv"))
    assert (joined.rank_send != joined.rank_recv).all() and len(joined) == len(starts)


def test_the_validator_rejects_broken_traces(launched):
    import copy

    trace = launched(dp=1).traces[0]
    assert validate_trace(trace) == []
    bad = copy.deepcopy(trace)
    spans = [e for e in bad["traceEvents"] if e.get("ph") == "X" and e["tid"] == LANES["compute"]]
    spans[1]["ts"] = spans[0]["ts"] + spans[0]["dur"] / 2  # make two compute spans cross
    spans[1]["dur"] = spans[0]["dur"] * 10
    assert any("without nesting" in m for m in validate_trace(bad))
    bad = copy.deepcopy(trace)
    bad["traceEvents"].append(
        {
            "ph": "X",
            "pid": 0,
            "tid": 1,
            "name": "x",
            "cat": "collective",
            "ts": 1,
            "dur": 1,
            "args": {"op": "all_reduce"},
        }
    )
    assert any("lack" in m for m in validate_trace(bad))
    bad = dict(reversed(list(trace.items())))
    assert validate_trace(bad)


def test_summary_memory_equals_the_prediction(launched):
    """Parameters 4Ψ, gradients 4Ψ (the buckets), Adam's moments 8Ψ: exactly; activations exactly the
    tensors our GPT saves for backward (workbench.predict.formulas.activation_bytes)."""
    run = launched(**BUCKETS)
    psi = run.config["params"]
    for r in run.summary["ranks"]:
        peak, pred = r["peak_bytes"], r["predicted_bytes"]
        assert peak["parameter"] == pred["parameter"] == 4 * psi
        assert peak["gradient"] == pred["gradient"] == 4 * psi
        assert peak["optimizer_state"] == pred["optimizer_state"] == 8 * psi
        assert peak["activation"] == pred["activation"]
        assert r["grad_sync_bytes_per_step"] == 4 * psi


def test_a_damaged_trace_is_named_with_where_and_how_to_rebuild(launched, tmp_path, capsys):
    """A trace cut short (a killed writer, a full disk) is named — the file, the byte where it breaks — by wb.load
    and by `workbench show`, with how to get a whole one back: trace.json is rebuilt from the per-rank files by
    `workbench merge`; a rank's file only from its stream, if the run still has it."""
    import shutil

    from workbench.cli.parser import main
    from workbench.trace.merge import DamagedTrace

    run_dir = tmp_path / "run"
    shutil.copytree(launched(dp=2).path, run_dir)
    merged = run_dir / "trace.json"
    whole = merged.read_bytes()
    merged.write_bytes(whole[: len(whole) // 2])
    assert main(["show", str(run_dir)]) == 1
    said = capsys.readouterr().out
    assert f"damaged: {merged} is damaged at byte" in said and "cut short" in said
    assert f"`workbench merge {run_dir}`" in said
    assert (
        main(["merge", str(run_dir)]) == 0 and json.loads(merged.read_text())["workbench"]["merged"]
    )
    assert main(["show", str(run_dir)]) == 0 and "damaged:" not in capsys.readouterr().out
    rank1 = run_dir / "trace_rank1.json"
    rank1.write_bytes(rank1.read_bytes()[:-100])
    with pytest.raises(
        DamagedTrace, match=rf"{rank1} is damaged at byte .* this rank's events are lost"
    ):
        _ = wb.load(str(run_dir)).events
