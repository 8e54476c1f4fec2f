"""Deterministic synthetic data that a model can learn.

Sequences come from a fixed random Markov chain: each token has `BRANCHES` possible successors
(chosen once from the seed), and each step of a sequence picks one of them uniformly. A model that
learns the chain reaches a loss of ln(BRANCHES) ≈ 1.39 from ln(V) at initialisation, so the loss falls
visibly within a few dozen steps.

The global batch of step k depends only on (seed, k): every strategy and every world size sees the
same samples, and a data-parallel rank takes its contiguous slice of rows (`shard_rows`; engine/train.py's
`batches` does it for this data and for data files alike).
"""

from __future__ import annotations

import torch

BRANCHES = 4


def transition_table(seed: int, vocab_size: int) -> torch.Tensor:
    """(V, BRANCHES) successor table of the chain."""
    g = torch.Generator().manual_seed(seed * 7919 + 17)
    return torch.randint(0, vocab_size, (vocab_size, BRANCHES), generator=g)


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator a step's samples are drawn from: a function of (seed, step) only (data_source.py's
    file windows draw their offsets from it too)."""
    return torch.Generator().manual_seed((seed + 1) * 1_000_003 + step)


def global_batch(seed: int, step: int, batch: int, seq_len: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both (batch, seq_len) int64; targets are inputs shifted by one."""
    table = transition_table(seed, vocab_size)
    g = step_generator(seed, step)
    tokens = torch.empty(batch, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab_size, (batch,), generator=g)
    choice = torch.randint(0, BRANCHES, (batch, seq_len), generator=g)
    for t in range(seq_len):
        tokens[:, t + 1] = table[tokens[:, t], choice[:, t]]
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def shard_rows(x: torch.Tensor, index: int, count: int) -> torch.Tensor:
    """Rows [index·B/count, (index+1)·B/count) of a (B, ...) tensor, as a tensor of its own (so the
    memory accounting sees only this rank's share)."""
    per = x.size(0) // count
    return x[index * per:(index + 1) * per].clone()
