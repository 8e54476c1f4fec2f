"""Data from files: nanoGPT's uint16 train.bin and byte-level text. Batches are a function of (seed, step)
only, so dp=2 trains the same model as one process on them (the correctness oracle, as for the synthetic
data); bad files are ConfigErrors before any process starts."""

import numpy as np
import pytest
import torch

import workbench as wb
from workbench.config import ConfigError
from workbench.config.data_spec import check_data
from workbench.data.files import TokenFile

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity. "
) * 40


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "dickens.txt"
    path.write_text(TEXT)
    return str(path)


def test_windows_are_a_function_of_seed_and_step(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    f = TokenFile(str(path))
    x, y = f.global_batch(seed=0, step=3, batch=4, seq_len=8)
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.int64
    assert torch.equal(y, x + 1), "targets are the inputs shifted by one token"
    again, _ = TokenFile(str(path)).global_batch(seed=0, step=3, batch=4, seq_len=8)
    other, _ = f.global_batch(seed=0, step=4, batch=4, seq_len=8)
    assert torch.equal(x, again) and not torch.equal(x, other)


def test_bad_data_is_named_before_any_process_starts(tmp_path, text_file):
    with pytest.raises(wb.ConfigError, match="no such file"):
        check_data(str(tmp_path / "missing.bin"), 50304, 16)
    with pytest.raises(wb.ConfigError, match="vocab_size ≥ 256"):
        wb.RunConfig(data=f"text:{text_file}").validate()  # tiny has 64 token ids
    big = tmp_path / "train.bin"
    np.array([1, 2, 700] * 400, dtype=np.uint16).tofile(big)
    with pytest.raises(wb.ConfigError, match="reach 700"):
        wb.RunConfig(model={"base": "small"}, data=str(big)).validate()  # small has 512
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"abc")
    with pytest.raises(wb.ConfigError, match="uint16"):
        check_data(str(odd), 50304, 4)
    with pytest.raises(wb.ConfigError, match="holds 3 tokens"):
        check_data(f"text:{odd}", 256, 16)


def test_dp2_on_text_trains_the_same_model_as_one_process(launched, text_file):
    """Same seed, same global batch (windows drawn by (seed, step)): the dp=2 losses equal one process's
    within 1e-5 relative — fp32 all-reduce of two half-batch gradients reorders sums (≈1e-7 per step)."""
    model = {"base": "tiny", "vocab_size": 256, "seq_len": 32}
    one = launched(model=model, data=f"text:{text_file}", steps=8)
    two = launched(model=model, data=f"text:{text_file}", steps=8, dp=2)
    a, b = one.metrics.loss.to_numpy(), two.metrics.loss.to_numpy()
    assert np.allclose(a, b, rtol=1e-5, atol=0), (a, b)
    assert a[-1] < a[0] - 0.5, "the model learns the text"


def test_a_meta_pkl_that_would_run_code_is_refused(tmp_path):
    """meta.pkl beside a .bin is read as plain data only: nanoGPT's own loads, one carrying a callable
    (here os.system, through __reduce__) is refused by name before it can run — nothing is executed."""
    import os
    import pickle

    good, bad = tmp_path / "good", tmp_path / "bad"
    for d in (good, bad):
        d.mkdir()
        (np.arange(100) % 65).astype(np.uint16).tofile(d / "train.bin")
    chars = [chr(c) for c in range(32, 97)]
    (good / "meta.pkl").write_bytes(
        pickle.dumps(
            {
                "vocab_size": 65,
                "itos": dict(enumerate(chars)),
                "stoi": {c: i for i, c in enumerate(chars)},
            }
        )
    )
    check_data(str(good / "train.bin"), vocab_size=65, seq_len=16)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (bad / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65, "x": Payload()}))
    with pytest.raises(ConfigError, match=r"refusing to load .*meta.pkl: it asks for posix.system"):
        check_data(str(bad / "train.bin"), vocab_size=65, seq_len=16)
    assert not marker.exists(), "nothing was executed"
