"""The held-out loss (engine/evaluate.py): computed with the run's own strategy, forward only, it equals one
process's for dp, tp + sp, pp, cp and ep (the oracle's loss tolerance, 1e-5 relative: the same model and
batches, only the order of fp32 sums differs); evaluating does not change what trains; held-out tokens are
never trained on."""

import json

import numpy as np
import pytest

import workbench as wb
from tests.test_data_parallel import LOSS_RTOL, assert_same_training
from tests.test_llama import EVAL
from workbench.config.data_spec import check_data
from workbench.data.files import TokenFile
from workbench.engine.evaluate import due


def val_losses(run):
    m = run.metrics
    return list(m.step[m.val_loss.notna()]), list(m.val_loss.dropna())


@pytest.mark.parametrize(
    "config",
    [
        {"dp": 2},
        {"tp": 2, "sequence_parallel": True},
        {"pp": 2, "schedule": "1f1b", "microbatches": 4},
        {"cp": 2},
        {"dp": 2, "zero": 3},
    ],
    ids=["dp2", "tp2-sp", "pp2-1f1b", "cp2", "zero3"],
)
def test_the_held_out_loss_is_one_process_s(launched, config):
    """The same runs tests/test_llama.py holds to one process in training (cached: no launch of their own)."""
    steps, single = val_losses(launched(model="tiny-llama", **EVAL))
    steps_here, here = val_losses(launched(model="tiny-llama", **config, **EVAL))
    assert steps == steps_here == [2, 5]  # after steps 3 and 6 (0-based 2 and 5)
    for a, b in zip(here, single, strict=True):
        assert abs(a - b) <= LOSS_RTOL * b, (here, single)
    assert single[1] < single[0], "the model learns: its held-out loss falls"


def test_expert_parallel_held_out_loss_is_one_process_s(launched):
    _, single = val_losses(launched(model="tiny-llama-moe", **EVAL))
    _, here = val_losses(launched(model="tiny-llama-moe", dp=2, ep=2, **EVAL))
    assert all(abs(a - b) <= LOSS_RTOL * b for a, b in zip(here, single, strict=True)), (
        here,
        single,
    )


def test_evaluating_does_not_change_what_trains(launched):
    """A run with evaluation every 2 steps trains bit for bit what the same run without it trains (the
    run tests/test_data_parallel.py compares everything with)."""
    with_eval = launched(dp=1, eval_every=2)
    assert_same_training(with_eval, launched(dp=1), loss_rtol=0.0, norm_rtol=0.0)
    assert with_eval.metrics.val_loss.notna().sum() == 3
    rows = [json.loads(x) for x in open(f"{with_eval.path}/metrics.jsonl")]
    assert [r["step"] for r in rows if r.get("val_loss") is not None] == [1, 3, 5]


def test_when_it_is_due():
    assert [s for s in range(10) if due(s, 4, 10)] == [3, 7, 9]  # and after the last step
    assert not any(due(s, 0, 10) for s in range(10))


def test_a_file_s_held_out_tokens_are_never_trained_on(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    train, val = TokenFile(str(path)), TokenFile(str(path), part="val")
    assert (len(train.tokens), int(val.tokens[0])) == (900, 900)  # the last 10 %
    x, y = val.global_batch(seed=0, step=0, batch=8, seq_len=16)
    assert int(x.min()) >= 900 and int(y.max()) < 1000
    xt, _ = train.global_batch(seed=0, step=0, batch=64, seq_len=16)
    assert int(xt.max()) < 900  # training windows stay in the first 90 %, targets included
    # nanoGPT's val.bin beside train.bin is taken as it is, and the training file then trains whole
    (np.arange(500, 700, dtype=np.uint16)).tofile(tmp_path / "val.bin")
    train, val = TokenFile(str(path)), TokenFile(str(path), part="val")
    assert len(train.tokens) == 1000 and int(val.tokens[0]) == 500 and len(val.tokens) == 200


def test_bad_held_out_data_is_named_before_launch(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("x" * 200)  # 20 bytes held out: a window of seq_len + 1 = 33 does not fit
    with pytest.raises(wb.ConfigError, match="held out for the validation loss"):
        check_data(f"text:{text}", 256, 32, evaluating=True)
    with pytest.raises(wb.ConfigError, match="val_data"):
        wb.RunConfig(val_data=f"text:{text}").validate()  # synthetic data holds out its own stream
    with pytest.raises(wb.ConfigError, match="eval_batches"):
        wb.RunConfig(eval_every=1, eval_batches=0).validate()


def test_the_held_out_loss_reaches_the_loggers_and_the_progress_line():
    from workbench.engine.logs.tensorboard import step_scalars
    from workbench.launching.progress import last_val_loss

    class NoMemory:
        peak: dict = {}
        peak_total = 0

    row = {
        "step": 3,
        "loss": 2.5,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "tokens_per_s": 10.0,
        "step_time_s": 0.1,
        "val_loss": 2.25,
    }
    # TensorBoard's and W&B's points
    assert step_scalars(row, [], 0.0, NoMemory())["val/loss"] == 2.25
    rows = [json.dumps(r).encode() for r in (row, {**row, "step": 4, "val_loss": None})]
    assert last_val_loss(rows) == 2.25


def _evaluate_through_the_cuda_batch_path(rank: int, world: int, run_dir: str) -> None:
    """One rank evaluates twice with the same model: its held-out batches made as on the CPU, then through the
    CUDA path (engine/batches.py: prepared ahead, pinned, copied without blocking) with the device faked — the
    copy is a stand-in that records each batch it moves and hands the host tensor back."""
    import os

    import torch

    from workbench.engine import batches as batch_module
    from workbench.engine.batches import Batches
    from workbench.engine.context import setup
    from workbench.engine.evaluate import evaluate
    from workbench.engine.parallelize import parallelize
    from workbench.engine.train_step import train_step

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    cfg = wb.RunConfig(
        model="tiny", steps=2, backend="gloo", eval_every=1, eval_batches=3
    ).validate()
    ctx = setup(cfg, run_dir)
    strategy = parallelize(cfg, ctx)
    train_step(
        strategy, Batches(cfg, ctx.device, dp_index=0, dp_size=1), 0, config=cfg, measured=False
    )
    on_cpu = evaluate(
        strategy, Batches(cfg, ctx.device, dp_index=0, dp_size=1, part="val"), 0, config=cfg
    )
    moved = []
    batch_module.to_device = lambda batch, device: (
        moved.append((device.type, batch[0][0, :4].tolist())) or batch
    )
    faked = Batches(cfg, torch.device("cuda"), dp_index=0, dp_size=1, part="val")
    on_cuda = evaluate(strategy, faked, 0, config=cfg)
    assert on_cuda == on_cpu, (on_cuda, on_cpu)  # the same batches, the same model: the same number
    cpu_rows = [
        Batches(cfg, ctx.device, dp_index=0, dp_size=1, part="val").host(k)[0][0, :4].tolist()
        for k in range(3)
    ]
    assert moved == [("cuda", row) for row in cpu_rows], "each held-out batch copied once, in order"
    assert faked.ready == {}, "none prepared past the last held-out batch"
    train = Batches(cfg, torch.device("cuda"), dp_index=0, dp_size=1)
    train.prepare(1)
    train.prepare(2)  # past the run's last step: nothing
    assert list(train.ready) == [1] and train.get(1) is not None and train.ready == {}


def test_evaluation_runs_through_the_cuda_batch_path():
    """On CUDA the held-out batches were refused by `prepare` and then asked of `ready`: a KeyError at the first
    evaluation of any GPU run. Now each comes through the same path as a training batch."""
    import tempfile

    from tests.distributed import run_ranks

    with tempfile.TemporaryDirectory() as d:
        run_ranks(_evaluate_through_the_cuda_batch_path, 1, d)
