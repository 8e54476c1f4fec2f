"""A data file opened in a rank: nanoGPT's `train.bin` (uint16 token ids) or any file read as bytes
(`text:FILE`), its spec checked before launch by config/data_spec.py.

A file's global batch of step k is `batch` windows of seq_len + 1 tokens at offsets drawn from a generator
seeded by (seed, k) — a function of (seed, step) only, as for the synthetic data (data/synthetic.py), so
every strategy and every world size sees the same rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from workbench.config.data_spec import parse_data, split, token_array
from workbench.data.synthetic import held_out_generator, step_generator


class TokenFile:
    """A data file's training part or held-out part (config/data_spec.py's `split`), opened once in a rank;
    `global_batch(seed, step, batch, seq_len)` as data/synthetic.py's. The held-out part's batches are drawn
    from the held-out generator stream, so evaluating never moves the training batches."""

    def __init__(self, spec: str, val_data: str | None = None, part: str = "train") -> None:
        kind, path = _file(spec)
        where, start, end = split(spec, val_data, len(token_array(kind, path)), part)
        self.kind, self.path = _file(where)
        self.part = part
        tokens = token_array(self.kind, self.path)
        self.tokens = tokens[start : len(tokens) if end < 0 else end]  # a view of the memory map

    def global_batch(
        self, seed: int, step: int, batch: int, seq_len: int, rows: tuple[int, int] | None = None
    ) -> tuple[Any, Any]:
        """(inputs, targets), both (batch, seq_len) int64: windows at offsets drawn from (seed, step); `rows`:
        only rows lo..hi−1 of them (a data-parallel rank's)."""
        g = step_generator(seed, step) if self.part == "train" else held_out_generator(seed, step)
        offsets = torch.randint(0, len(self.tokens) - seq_len - 1, (batch,), generator=g).tolist()
        if rows is not None:
            offsets = offsets[rows[0] : rows[1]]
        windows = np.stack(
            [np.asarray(self.tokens[o : o + seq_len + 1], dtype=np.int64) for o in offsets]
        )
        window = torch.from_numpy(windows)
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def _file(spec: str) -> tuple[str, str]:
    """(kind, path) of a data file's spec: 'bin' or 'text' (synthetic data has no file: data/synthetic.py)."""
    kind, path = parse_data(spec)
    if path is None:
        raise ValueError(f"--data {spec}: no file to open (synthetic data is made, not read)")
    return kind, path
