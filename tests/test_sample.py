"""Sampling from a checkpoint (engine/sample.py): a tp = 2 run's checkpoint read back whole on one process —
its held-out loss, recomputed there, is the run's own (so every piece landed where it belongs) — and
sampled from Python and from the command line alike."""

import pickle
import subprocess
import sys

import pytest
import torch

import workbench as wb
from tests.test_data_source import TEXT
from workbench.engine.batches import Batches
from workbench.engine.sample import codec, load_whole_model


@pytest.fixture(scope="module")
def tp2_run(launched, tmp_path_factory):
    text = tmp_path_factory.mktemp("sample") / "dickens.txt"
    text.write_text(TEXT)
    model = {"base": "tiny-llama", "vocab_size": 256, "seq_len": 32}
    return launched(
        model=model,
        data=f"text:{text}",
        tp=2,
        sequence_parallel=True,
        lr=1e-2,
        steps=6,
        checkpoint_every=6,
        eval_every=6,
        eval_batches=2,
    )


def test_a_tp2_checkpoint_is_read_whole_on_one_process(tp2_run):
    """The model assembled from both tp ranks' pieces gives, on the held-out batches, the held-out loss the
    tp = 2 run computed after its last step (within the oracle's 1e-5: tp sums its matmuls in two halves)."""
    model, step = load_whole_model(f"{tp2_run.path}/checkpoints/step_000006")
    assert step == 6
    cfg = tp2_run.run_config
    held_out = Batches(cfg, torch.device("cpu"), dp_index=0, dp_size=1, part="val")
    with torch.no_grad():
        loss = (
            sum(float(model(*held_out.get(k))) for k in range(cfg.eval_batches)) / cfg.eval_batches
        )
    expected = tp2_run.metrics.val_loss.dropna().iloc[-1]
    assert abs(loss - expected) <= 1e-5 * expected, (loss, expected)


def test_sample_from_python_and_the_command_line(tp2_run):
    s = wb.sample(tp2_run.path, prompt="It was", tokens=24, temperature=0.8, top_k=20, seed=3)
    assert s.text.startswith("It was") and len(s.new_ids) == 24 and s.step == 6
    assert all(0 <= i < 256 for i in s.new_ids)
    assert (
        wb.sample(tp2_run.path, prompt="It was", tokens=24, temperature=0.8, top_k=20, seed=3).text
        == s.text
    )
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench.cli",
            "sample",
            tp2_run.path,
            "--prompt",
            "It was",
            "--tokens",
            "24",
            "--temperature",
            "0.8",
            "--top-k",
            "20",
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert cli.stdout.rstrip("\n") == s.text
    greedy = wb.sample(tp2_run.path, prompt="It was", tokens=8, temperature=0)
    assert (
        greedy.text
        == wb.sample(tp2_run.path, prompt="It was", tokens=8, temperature=0, seed=9).text
    )


def test_bad_sample_requests_are_named(tmp_path, tp2_run):
    with pytest.raises(wb.ConfigError, match="tokens=0"):
        wb.sample(tp2_run.path, tokens=0)
    with pytest.raises(wb.ConfigError, match="temperature"):
        wb.sample(tp2_run.path, temperature=-1.0)
    from workbench.engine.checkpoint.files import CheckpointError

    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        wb.sample(str(tmp_path))


def test_nanogpt_character_sets_and_plain_ids(tmp_path):
    data = tmp_path / "train.bin"
    data.write_bytes(b"\0\0")
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump(
            {"vocab_size": 3, "stoi": {"a": 0, "b": 1, "\n": 2}, "itos": {0: "a", 1: "b", 2: "\n"}},
            f,
        )
    encode, decode = codec({"data": str(data)}, 3)
    assert encode("ab\n") == [0, 1, 2] and decode([1, 0]) == "ba"
    with pytest.raises(wb.ConfigError, match="character set"):
        encode("z")
    encode, decode = codec({"data": "synthetic"}, 64)
    assert encode("3 5") == [3, 5] and decode([3, 5]) == "3 5"
    with pytest.raises(wb.ConfigError, match="token ids"):
        encode("hello")
