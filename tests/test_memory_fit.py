"""A run that cannot fit in memory is refused before any process starts (launching/memory_fit.py): its predicted
true peak — model states, activations, the loss's transient, and what each process holds before it trains — times
the ranks on this machine, against the memory free here, naming both and the variants that would fit."""

import os
import subprocess
import sys

import pytest

import workbench as wb
from workbench.launching import memory_fit


def test_gpt_1_3b_on_two_cpu_ranks_is_refused_before_any_process_starts(tmp_path):
    """On a machine of this project's kind (24 GiB) — whatever is free on the one running the test, well under
    the ~120 GiB two ranks of gpt-1.3b would need at their peak."""
    out = tmp_path / "big"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench.cli",
            "run",
            "--model",
            "gpt-1.3b",
            "--dp",
            "2",
            "--steps",
            "2",
            "--lr",
            "3e-4",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert (
        "GiB for its 2 rank(s) on this machine at its peak" in done.stderr
        and "GiB free" in done.stderr
    )
    assert "--no-check-memory" in done.stderr
    assert not out.exists(), "refused before anything was written or started"


def test_the_refusal_names_what_would_fit(monkeypatch):
    config = wb.RunConfig(model="small", dp=2).validate()
    base = memory_fit.rank_peak(config, "cpu", "gloo")
    zero3 = memory_fit.rank_peak(config.replace(zero=3), "cpu", "gloo")
    full = memory_fit.rank_peak(config.replace(recompute="full"), "cpu", "gloo")
    assert full < base and zero3 < base
    # both variants fit, the run itself does not
    room = 2 * (max(full, zero3) + memory_fit.RANK_OVERHEAD) + 1
    assert 2 * (base + memory_fit.RANK_OVERHEAD) > room
    monkeypatch.setattr(memory_fit, "host_available", lambda: room)
    with pytest.raises(wb.ConfigError, match=r"these would fit: zero=3, .*recompute='full'"):
        memory_fit.check_fits_memory(config, "gloo", 2)
    monkeypatch.setattr(
        memory_fit, "host_available", lambda: 2 * (base + memory_fit.RANK_OVERHEAD) + 1
    )
    memory_fit.check_fits_memory(config, "gloo", 2)  # fits: nothing said


def test_no_check_memory_launches_anyway(monkeypatch, tmp_path):
    monkeypatch.setattr(memory_fit, "host_available", lambda: 1.0)  # nothing fits in a byte
    with pytest.raises(wb.ConfigError, match="1 B|0.0 GiB free"):
        wb.launch(wb.RunConfig(steps=1), out=str(tmp_path / "a"), progress=False)
    run = wb.launch(
        wb.RunConfig(steps=1), out=str(tmp_path / "b"), progress=False, check_memory=False
    )
    assert len(run.metrics) == 1
    assert os.path.exists(run.path)
