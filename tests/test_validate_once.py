"""A config is validated once, at the door, and travels as a ValidConfig: from the CLI, `wb.launch`,
compare and an elastic launch, `RunConfig.validate` runs once for each config that reaches the ranks.

No rank starts here: torchrun's start is replaced by a process that has already finished, and the run it
would have written by a stand-in, so that each path runs the launcher's own code up to torchrun's command
line (request.json, the memory and disk checks, the elastic worlds) in a fraction of a second."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from types import SimpleNamespace

import pytest

import workbench as wb
from workbench.cli import main
from workbench.config import ConfigError, RunConfig, ValidConfig
from workbench.launching import launcher
from workbench.launching.torchrun_command import Nodes
from workbench.studies import comparison


class _Finished:
    """torchrun, already done and successful."""

    def poll(self) -> int:
        return 0

    def wait(self) -> int:
        return 0


@pytest.fixture
def validations(monkeypatch):
    """Every time the rules run, by the settings they checked: `RunConfig._check`, which each ValidConfig's
    construction runs — `validate()` (a ValidConfig's own call too), and any other way one is built, such
    as `dataclasses.replace` — so a path that checks a config twice, by whatever route, counts 2. torchrun's
    command lines in `validations.commands`, and the configs launch ran with in `validations.launched`."""
    seen: Counter[str] = Counter()
    commands: list[list[str]] = []
    launched: list[RunConfig] = []
    check = RunConfig._check

    def counted(self: RunConfig) -> None:
        seen[self.to_json()] += 1
        check(self)

    def start(cmd, env, log, log_path, *, echo=False, fork_ranks=False):
        commands.append(cmd)
        return _Finished()

    def run(config, run_dir, **options):
        launched.append(config)
        return original_run(config, run_dir, **options)

    original_run = launcher._run
    monkeypatch.setattr(RunConfig, "_check", counted)
    monkeypatch.setattr(launcher, "_start_torchrun", start)
    monkeypatch.setattr(launcher, "_run", run)
    monkeypatch.setattr(launcher, "load", lambda run_dir: SimpleNamespace(path=run_dir))
    return SimpleNamespace(seen=seen, commands=commands, launched=launched)


def test_wb_launch_validates_a_plain_config_once(tmp_path, validations):
    config = RunConfig(dp=2, steps=2, global_batch=4)
    wb.launch(config, out=str(tmp_path / "run"), progress=False)
    assert validations.seen == {config.to_json(): 1}
    assert isinstance(validations.launched[0], ValidConfig) and validations.commands


def test_wb_launch_takes_a_valid_config_as_it_is(tmp_path, validations):
    config = RunConfig(dp=2, steps=2, global_batch=4).validate()
    wb.launch(config, out=str(tmp_path / "run"), progress=False)
    assert validations.seen == {config.to_json(): 1}  # the call above, and none in the launcher


def test_the_cli_validates_once(tmp_path, validations):
    out = str(tmp_path / "run")
    flags = ["run", "--dp", "2", "--steps", "2", "--global-batch", "4", "--out", out, "--quiet"]
    assert main(flags) == 0
    assert sum(validations.seen.values()) == 1 and len(validations.commands) == 1
    with open(os.path.join(out, "request.json")) as f:
        assert f.read() in validations.seen


def test_compare_validates_each_config_and_baseline_once(tmp_path, validations, monkeypatch):
    monkeypatch.setattr(comparison, "_row", lambda name, run, base, hw: {"strategy": name})
    configs = [
        RunConfig(dp=2, steps=2, global_batch=4),
        RunConfig(dp=2, zero=1, steps=2, global_batch=4),
    ]
    wb.compare(configs, out_dir=str(tmp_path / "cmp"), progress=False)
    baseline = comparison.baseline_config(configs[0])
    assert baseline == comparison.baseline_config(configs[1])  # one baseline for both
    assert validations.seen == {c.to_json(): 1 for c in (*configs, baseline)}
    assert len(validations.launched) == 3 and all(
        isinstance(c, ValidConfig) for c in validations.launched
    )


def test_an_elastic_launch_validates_each_world_once(tmp_path, validations):
    """nnodes 1:2: the config as given, and each world the group may re-form as (dp 1 and dp 2, elastic),
    each its own config, validated once; torchrun's command line is the elastic one.

    Why each world is its own config: the ranks of an elastic run read the config of the world torchrun
    formed (engine/restart.py: dp = WORLD_SIZE / (cp·tp·pp)), and a config's rules depend on its dp (the
    batch's split, ZeRO's shards, the experts' carving) and on elastic=True (checkpoints and restarts must
    be on). So the launcher checks, before any process starts, every world MIN..MAX machines can form —
    settings that differ, each checked once. The user's settings as given (elastic=False here) are checked
    first, so that a bad value is named in the user's own terms."""
    config = RunConfig(dp=2, steps=4, global_batch=4, checkpoint_every=2, max_restarts=1)
    nodes = Nodes(nnodes="1:2", rdzv_endpoint="127.0.0.1:29400")
    wb.launch(config, out=str(tmp_path / "run"), progress=False, nodes=nodes)
    worlds = [config.replace(dp=dp, elastic=True) for dp in (1, 2)]
    assert validations.seen == {c.to_json(): 1 for c in (config, *worlds)}
    assert validations.launched == [worlds[1]]
    cmd = validations.commands[0]
    assert cmd[cmd.index("--nnodes") + 1] == "1:2" and "--rdzv-conf" in cmd


def test_an_elastic_config_is_not_validated_again_as_its_own_twin(tmp_path, validations):
    """A config that already says elastic=True, launched on nnodes 1:2: it is the MAX machines' world
    itself, taken as it is (`elastic_config` reuses it); only the one-machine world (dp 1) is new. Two
    checks in all, each once."""
    config = RunConfig(
        dp=2, steps=4, global_batch=4, checkpoint_every=2, max_restarts=1, elastic=True
    )
    nodes = Nodes(nnodes="1:2", rdzv_endpoint="127.0.0.1:29400")
    wb.launch(config, out=str(tmp_path / "run"), progress=False, nodes=nodes)
    smaller = config.replace(dp=1)
    assert validations.seen == {config.to_json(): 1, smaller.to_json(): 1}
    assert sum(validations.seen.values()) == 2
    assert validations.launched == [config] and isinstance(validations.launched[0], ValidConfig)


def test_no_valid_config_is_built_without_its_checks():
    """A ValidConfig's construction runs the rules: built directly or copied by `dataclasses.replace`
    with a bad value, it raises the same ConfigError as `validate()`; a good change is checked and valid."""
    with pytest.raises(ConfigError, match=r"dp=0: must be a positive integer"):
        ValidConfig(dp=0)
    valid = RunConfig(dp=2, global_batch=4).validate()
    with pytest.raises(ConfigError, match=r"dp=0: must be a positive integer"):
        dataclasses.replace(valid, dp=0)
    with pytest.raises(ConfigError, match=r"global_batch=4 is not divisible by dp=3"):
        dataclasses.replace(valid, dp=3)
    with pytest.raises(ConfigError, match=r"zero=5: valid stages"):
        ValidConfig(zero=5)
    wider = dataclasses.replace(valid, dp=4)
    assert isinstance(wider, ValidConfig) and wider == RunConfig(dp=4, global_batch=4)
    assert type(valid.replace(dp=0)) is RunConfig  # `replace`: a plain config, to be validated
