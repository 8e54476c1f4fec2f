"""Where the tokens come from: the synthetic Markov chain (the default), nanoGPT's `train.bin`, or any text
file read as bytes.

    data = "synthetic"          data/synthetic.py's chain: learnable, no file
    data = "PATH.bin"           nanoGPT's format: a flat array of uint16 token ids (np.memmap), e.g. what
                                nanoGPT's data/openwebtext/prepare.py writes (GPT-2 BPE, ids < 50257)
    data = "text:FILE"          the file's bytes are the tokens (vocab 256): your own text, no tokenizer

A file's global batch of step k is `batch` windows of seq_len + 1 tokens at offsets drawn from a generator
seeded by (seed, k) — a function of (seed, step) only, as for the synthetic data, so every strategy and every
world size sees the same rows and the equality tests hold (data/synthetic.py's `shard_rows` splits them).

The held-out tokens (the validation loss, engine/evaluate.py) never train:

    synthetic                   the same chain, a separate seed stream (data/synthetic.py's `held_out_generator`)
    a .bin file                 nanoGPT's `val.bin` beside a `train.bin`, else the file's last 10 %
    text:FILE                   the file's last 10 %
    val_data=SPEC               that file instead (the training file then trains whole)

This module checks a data spec before any process starts (`check_data`, numpy only); data/files.py's
`TokenFile` opens it in a rank (torch).
"""

from __future__ import annotations

import functools
import json
import os
import pickle
from typing import Any

import numpy as np

from workbench.config.model_config import ConfigError

#: how many tokens of a .bin file `check_data` reads for the largest id (the whole file when smaller)
CHECK_TOKENS = 64 * 1024 * 1024


def parse_data(spec: str) -> tuple[str, str | None]:
    """('synthetic', None), ('bin', path) or ('text', path)."""
    if spec == "synthetic":
        return "synthetic", None
    if spec.startswith("text:"):
        return "text", spec[len("text:") :]
    return "bin", spec


def token_array(kind: str, path: str) -> np.ndarray:
    return np.memmap(path, dtype=np.uint16 if kind == "bin" else np.uint8, mode="r")


#: the share of a data file held out for the validation loss when no separate file is given
HELD_OUT = 0.1


def val_file(spec: str, val_data: str | None) -> str | None:
    """The separate held-out file's spec: `val_data`, else nanoGPT's val.bin beside a train.bin, else None."""
    if val_data is not None:
        return val_data
    kind, path = parse_data(spec)
    if kind == "bin" and path is not None and os.path.basename(path) == "train.bin":
        sibling = os.path.join(os.path.dirname(path), "val.bin")
        if os.path.isfile(sibling):
            return sibling
    return None


def split(spec: str, val_data: str | None, n_tokens: int, part: str) -> tuple[str, int, int]:
    """(spec, start, end): where `part` ('train' or 'val') of the data lies — a separate file whole, or the
    first 90 % of the training file for training and its last 10 % held out."""
    other = val_file(spec, val_data)
    if other is not None:
        return (spec, 0, n_tokens) if part == "train" else (other, 0, -1)
    cut = n_tokens - int(n_tokens * HELD_OUT)
    return (spec, 0, cut) if part == "train" else (spec, cut, n_tokens)


def check_data(
    spec: str, vocab_size: int, seq_len: int, val_data: str | None = None, evaluating: bool = False
) -> None:
    """ConfigError unless the data exists, its training part (`split`) — and when `evaluating`, its held-out
    part — holds a window of seq_len + 1 tokens and a choice of offsets, and its token ids fit the model's
    vocabulary (byte text needs vocab_size ≥ 256; a .bin file its largest id + 1, or the vocab_size of
    nanoGPT's meta.pkl beside it). A `val_data` file is checked the same way and must be of the training
    data's kind."""
    kind, path = parse_data(spec)
    if kind == "synthetic":
        if val_data is not None:
            raise ConfigError(
                f"val_data={val_data!r} with data='synthetic': the synthetic chain holds out its own "
                f"seed stream; give val_data only with a data file"
            )
        return
    other = val_file(spec, val_data)
    if val_data is not None:
        if parse_data(val_data)[0] != kind:
            raise ConfigError(
                f"val_data={val_data!r}: of another kind than data={spec!r} ({kind}); give the "
                f"held-out tokens in the training data's form"
            )
        _check_file(val_data, vocab_size, seq_len)
    _check_file(spec, vocab_size, seq_len, held_out=other is None, evaluating=evaluating)


def _check_file(
    spec: str, vocab_size: int, seq_len: int, held_out: bool = False, evaluating: bool = False
) -> None:
    """One file: it exists, what trains holds a window (all of it, or with `held_out` its first 90 %) and,
    when `evaluating`, so does its held-out 10 %; its ids fit."""
    kind, path = parse_data(spec)
    if not path or not os.path.isfile(path):
        raise ConfigError(
            f"data={spec!r}: no such file; valid: 'synthetic', a nanoGPT .bin file (uint16 tokens) "
            f"or 'text:FILE' (a text file read as bytes)"
        )
    size = os.path.getsize(path)
    if kind == "bin" and size % 2:
        raise ConfigError(
            f"data={spec!r}: {size} bytes is not a whole number of uint16 tokens (nanoGPT's format)"
        )
    tokens = token_array(kind, path) if size else np.zeros(0, np.uint8)
    held = int(len(tokens) * HELD_OUT) if held_out else 0
    # the smaller part that must hold a window
    part = held if evaluating and held_out else len(tokens) - held
    if part < seq_len + 2:
        held_note = (
            ""
            if not held_out
            else f", of which {held} held out for the validation loss ({HELD_OUT:.0%}: give "
            f"val_data=FILE to train on all of it)"
        )
        raise ConfigError(
            f"data={spec!r} holds {len(tokens)} tokens{held_note}: a window needs seq_len + 1 = "
            f"{seq_len + 1} (and a choice of offsets); use more data or a shorter model.seq_len"
        )
    needed = (
        256
        if kind == "text"
        else _meta_vocab(path) or _largest_id(path, size, os.path.getmtime(path)) + 1
    )
    if vocab_size < needed:
        what = (
            "byte-level text has 256 token ids"
            if kind == "text"
            else f"its token ids reach {needed - 1}"
        )
        example = json.dumps({"base": "small", "vocab_size": needed})
        raise ConfigError(
            f"data={spec!r}: {what} but model.vocab_size={vocab_size}; use a model with vocab_size ≥ "
            f"{needed} (e.g. --model '{example}', or a gpt2 preset)"
        )


@functools.lru_cache(maxsize=8)
def _largest_id(path: str, size: int, mtime: float) -> int:
    """The largest token id in a .bin file's first CHECK_TOKENS tokens — read once per file version in a
    process (validation runs in the CLI, in launch() and in every rank)."""
    return int(token_array("bin", path)[:CHECK_TOKENS].max())


class _PlainData(pickle.Unpickler):
    """An unpickler that builds no object of any class: a pickle of dicts, lists, tuples, sets, strings,
    bytes, numbers, booleans and None loads (those need no class lookup); anything else names a global
    (a class or a callable: how a pickle runs code) and is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise ConfigError(
            f"refusing to load {self.path}: it asks for {module}.{name}, and a data directory's "
            f"meta.pkl may hold only plain data (nanoGPT's vocab_size, stoi, itos). A pickle can run "
            f"code when it is loaded; remove the file, or write it again from a source you trust"
        )

    def __init__(self, f: Any, path: str) -> None:
        super().__init__(f)
        self.path = path


def read_meta(meta: str) -> dict[str, Any]:
    """nanoGPT's meta.pkl, loaded as plain data only (`_PlainData`): no code from a data directory."""
    with open(meta, "rb") as f:
        data = _PlainData(f, meta).load()
    if not isinstance(data, dict):
        raise ConfigError(
            f"{meta}: expected nanoGPT's dict (vocab_size, stoi, itos), found {type(data).__name__}"
        )
    return data


def _meta_vocab(path: str) -> int | None:
    """nanoGPT's character-level datasets keep their vocab_size in meta.pkl beside train.bin."""
    meta = os.path.join(os.path.dirname(os.path.abspath(path)), "meta.pkl")
    if not os.path.exists(meta):
        return None
    return int(read_meta(meta).get("vocab_size", 0)) or None
