"""Bad configurations fail before any process starts, naming the value and what would be valid."""

import subprocess
import sys
import time

import pytest
import torch

from workbench import ConfigError, ModelConfig, RunConfig
from workbench.config import PRESETS


def test_dp_not_dividing_the_batch_names_value_and_valid_choices():
    with pytest.raises(ConfigError) as e:
        RunConfig(dp=3, global_batch=16).validate()
    msg = str(e.value)
    assert "dp=3" in msg and "global_batch=16" in msg and "[1, 2, 4, 8, 16]" in msg


def test_heads_not_dividing_hidden():
    with pytest.raises(ConfigError, match=r"heads=5 does not divide model.hidden=32"):
        RunConfig(model=ModelConfig(hidden=32, heads=5)).validate()


@pytest.mark.parametrize(
    "change",
    [
        {"dp": 0},
        {"schedule": "zigzag"},
        {"model": "huge"},
        {"zero": 4},
        {"allreduce": "tree"},
        {"bucket_mb": 0},
        {"steps": -1},
    ],
)
def test_invalid_values_are_rejected(change):
    with pytest.raises(ConfigError):
        RunConfig(**change).validate()


def test_config_round_trips_through_json():
    c = RunConfig(dp=2, model=ModelConfig(hidden=64, heads=8), bucket_mb=0.5)
    assert RunConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="unknown configuration keys"):
        RunConfig.from_dict({"dpp": 2})


def test_param_count_formula_matches_the_built_model():
    from workbench.model.gpt import GPT

    for name, cfg in PRESETS.items():
        if name.startswith("llama3"):
            continue  # tests/test_llama.py counts these, against the published figures too
        with torch.device("meta"):  # counted, not allocated: the presets go up to 1.4 B parameters
            built = GPT(cfg)
        assert sum(p.numel() for p in built.parameters()) == cfg.param_count()


def test_cli_rejects_before_starting_any_process(tmp_path):
    out = tmp_path / "bad"
    t = time.time()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench.cli",
            "run",
            "--dp",
            "3",
            "--global-batch",
            "16",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert "dp=3" in p.stderr and "Valid dp" in p.stderr
    assert not out.exists(), "no run directory: nothing was launched"
    assert time.time() - t < 30


def test_launch_rejects_before_starting_any_process(tmp_path):
    import workbench as wb

    with pytest.raises(ConfigError):
        wb.launch(RunConfig(dp=3, global_batch=16), out=str(tmp_path / "bad"), progress=False)
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "field, value",
    [
        ("lr", float("nan")),
        ("lr", -1.0),
        ("lr", float("inf")),
        ("weight_decay", -0.1),
        ("min_lr_ratio", 1.5),
        ("timeout_s", 0),
        ("seed", 1.5),
        ("capacity_factor", float("nan")),
    ],
)
def test_every_numeric_field_is_checked_for_its_range(field, value):
    with pytest.raises(ConfigError, match=rf"^{field}={value!r}: .* must be"):
        RunConfig(**{field: value}).validate()


def test_a_nan_learning_rate_is_refused_before_launch(tmp_path):
    out = tmp_path / "nan"
    p = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "run", "--lr", "nan", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "lr=nan" in p.stderr and "finite" in p.stderr, p.stderr
    assert not out.exists()
