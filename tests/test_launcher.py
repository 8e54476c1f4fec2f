"""The launcher, CLI and API without traps: a stopped or killed launcher leaves no process behind, an
earlier run is never replaced without --force, a run's config round-trips, and bad input of every kind
is a ConfigError (exit code 2) naming the value and what is valid."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import workbench as wb
from workbench import ConfigError, RunConfig
from workbench.cli import main


def _descendants(root: int) -> set[int]:
    """Every live process below `root`: torchrun (a subprocess, or forked warm by workbench.launching.warm_torchrun's
    server) and its ranks."""
    parents = {}
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except OSError:
            pass
    return alive


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="lists processes through /proc")
@pytest.mark.parametrize(
    "sig, warm",
    [
        (signal.SIGTERM, "1"),
        pytest.param(signal.SIGKILL, "1", marks=pytest.mark.slow),
        (signal.SIGKILL, "0"),
    ],
    ids=["SIGTERM-warm", "SIGKILL-warm", "SIGKILL-subprocess"],
)
def test_a_stopped_launcher_leaves_no_process_of_its_run(tmp_path, sig, warm):
    """The CLI is stopped in the middle of a long run: torchrun and its two ranks (and the warm server,
    launching/warm_torchrun.py) are gone within 10 s (SIGTERM: forwarded to torchrun, which stops the ranks;
    SIGKILL: parent-death signals, down the line)."""
    run_dir = str(tmp_path / "long")
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench.cli",
            "run",
            "--dp",
            "2",
            "--steps",
            "1000",
            "--fault",
            "straggle",
            "--fault-delay-s",
            "0.05",
            "--out",
            run_dir,
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "WORKBENCH_WARM_TORCHRUN": warm},
    )
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + 60
    while (
        not (os.path.exists(metrics) and os.path.getsize(metrics)) and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    family = _descendants(cli.pid)
    assert len(family) >= 3 + (warm == "1"), (
        "torchrun and two ranks are running (and the warm server)"
    )
    cli.send_signal(sig)
    out, _ = cli.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(family) == set(), "a process of the run outlived the launcher"
    if sig == signal.SIGTERM:
        assert cli.returncode == 130 and "partial results in" in out, out[-2000:]
        assert os.path.exists(metrics), "what the ranks wrote stays"


def test_ranks_forked_from_the_agent_train_what_fresh_interpreters_train(
    launched, tmp_path, monkeypatch
):
    """The suite's launches are warm: torchrun forked from a server that imported it, and its CPU ranks forked
    from its agent (`--run-path --start-method fork`: launching/warm_torchrun.py). The same run with warm
    launches off — torchrun and each rank a new interpreter — trains bit for bit the same model."""
    from workbench.launching.warm_torchrun import forked_ranks

    argv = [
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "workbench.launching.worker",
        "--run-dir",
        "R",
    ]
    rewritten = forked_ranks(argv)
    assert rewritten[:3] == argv[:3] and rewritten[-2:] == ["--run-dir", "R"]
    assert rewritten[3:6] == ["--run-path", "--start-method", "fork"] and rewritten[6].endswith(
        "worker.py"
    )
    monkeypatch.setenv("WORKBENCH_WARM_TORCHRUN", "0")
    cold = wb.launch(
        wb.RunConfig(dp=2, steps=6, timeout_s=30), out=str(tmp_path / "cold"), progress=False
    )
    warm = launched(dp=2)
    assert list(cold.metrics.loss) == list(warm.metrics.loss)
    assert list(cold.metrics.grad_norm) == list(warm.metrics.grad_norm)


def test_an_earlier_run_is_replaced_only_with_force(launched, tmp_path, capsys):
    run = launched(steps=2)
    out = str(tmp_path / "again")
    os.makedirs(out)
    with open(os.path.join(out, "request.json"), "w") as f:
        f.write(RunConfig().to_json())
    with pytest.raises(FileExistsError, match="force=True"):
        wb.launch(RunConfig(steps=2), out=out)
    assert main(["run", "--steps", "2", "--out", out, "--quiet"]) == 2
    assert "--force" in capsys.readouterr().err
    assert os.listdir(out) == ["request.json"], "nothing of the earlier run was touched"
    request = RunConfig.from_dict(json.load(open(os.path.join(run.path, "request.json"))))
    assert run.run_config == request
    # config.json's resolved facts are left out; its backend is the one resolved ('auto' became 'gloo')
    assert RunConfig.from_dict(run.config) == request.replace(backend=run.config["backend"])


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"model": {"hiden": 64}}, "model keys \\['hiden'\\] are unknown"),
        ({"model": {"base": "huge"}}, "unknown preset"),
        ({"optimizer": "lamb"}, "valid optimizers"),
    ],
)
def test_bad_configurations_name_the_value(bad, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**bad).validate()


def test_bad_input_to_the_cli_and_the_estimator(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--model", '{"hidden": 64'])
    assert e.value.code == 2 and "not valid JSON" in capsys.readouterr().err
    assert main(["show", "/nonexistent/run"]) == 2
    with pytest.raises(ConfigError, match="precision='banana'"):
        wb.estimate(wb.RunLayout(params=1e9, precision="banana"))
    with pytest.raises(ConfigError, match="tp=3 does not divide model.heads=40"):
        wb.estimate(wb.RunLayout(model=wb.ModelConfig(heads=40, hidden=2560), tp=3))
    from workbench.predict.estimator import A100_80GB

    assert str(wb.Cluster(64, A100_80GB)).startswith("64 nodes × 8 = 512")
    with pytest.raises(ConfigError, match="nodes=0"):
        wb.Cluster(0, A100_80GB)


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the message where there is no GPU"
)
def test_nccl_without_a_gpu_fails_before_launch(tmp_path):
    with pytest.raises(ConfigError, match="backend='nccl' needs CUDA"):
        wb.launch(RunConfig(backend="nccl"), out=str(tmp_path / "nccl"))
    assert not os.path.exists(tmp_path / "nccl")


def test_show_tells_an_unfinished_run_from_a_finished_one(launched, tmp_path, capsys):
    run = launched(steps=2)
    assert main(["show", run.path]) == 0
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "request.json").write_text(RunConfig().to_json())
    (unfinished / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "loss": 4.0, "step_time_s": 0.1}) + "\n"
    )
    assert main(["show", str(unfinished)]) == 1
    out = capsys.readouterr().out
    assert "did not finish" in out and "summary.json" not in out.split("files:")[1]


def test_report_writes_one_self_contained_page(launched, tmp_path):
    run = launched(steps=2)
    path = str(tmp_path / "report.html")
    assert main(["report", run.path, "--out", path]) == 0
    page = open(path).read()
    assert page.count("plotly.js v") == 1, "plotly.js embedded once: the page needs no network"
    assert page.count("Plotly.newPlot") >= 4, "loss, timeline and memory charts"
