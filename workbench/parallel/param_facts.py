"""What a rank's strategy knows about each parameter it trains, said once, in one typed table.

A parameter's facts decide how every later piece treats it:

    fact                          set where                                read by
    decay_ranges                  the strategy (optim/weight_decay.py's     the optimizers (AdamW, 1-bit Adam,
                                  rule), ZeRO for its slices                mixed precision, ZeRO-Offload)
    tp_sharded                    tensor parallelism's modules              the gradient norm (squares summed
                                  (parallel/tensor_parallel.py)             over tp), the checkpoint's owner
    sequence_parallel_partial     tensor parallelism with sequence          TensorParallelGrads (all-reduce
                                  parallelism                               over tp after backward)
    expert_sharded                expert parallelism's modules              the grad syncs (reduced over edp),
                                  (parallel/expert_parallel.py)             the norm (over ep), the checkpoint
    zero_group                    ZeRO, for each slice it cuts              the sharded gradient norm
    pipeline_copy                 DualPipe (engine/parallelize.py): the     the gradient norm (not counted),
                                  copy in the pipeline going up             the checkpoint's owner (not written)

`engine/parallelize.py` builds the table for the model once its parameters exist, and hands it by keyword
to whoever reads it: the grad syncs, the updaters, the checkpoint's layout. A ZeRO grad sync gives the
facts of the slices it cuts (`shard_facts`). Nothing is stuck on the Parameter objects themselves
(tests/test_parameter_facts.py scans the code for it). The table is strict: a tensor it does not list
raises (a parameter recreated after the table was built would otherwise read as plain, unseen); a piece
built on its own says so, `ParamTable.plain(params)`.

Where a 16-bit parameter's fp32 gradient lives is not a fact of this table but the state of the grad sync
that owns the buffer: parallel/main_grad.MainGrads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

#: [start, end) element ranges of a flattened tensor
Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True, kw_only=True)
class ParamFacts:
    """One parameter's (or one ZeRO slice's) facts. The defaults are a plain, whole tensor's: decayed
    whole, replicated, its gradient complete on every rank."""

    #: the element ranges weight decay shrinks (matrices all of it, gains and biases none, a ZeRO slice
    #: the runs of its matrices' elements); None: the whole tensor (an unmarked tensor, as torch's AdamW)
    decay_ranges: Ranges | None = None
    #: a tensor-parallel shard: each tp rank holds a different part (its norm's squares are summed over tp)
    tp_sharded: bool = False
    #: applied to a slice of the sequence under sequence parallelism: its gradient is partial on each tp
    #: rank until TensorParallelGrads sums it
    sequence_parallel_partial: bool = False
    #: an expert-parallel shard: this ep rank's experts (reduced over edp, its norm's squares over ep)
    expert_sharded: bool = False
    #: a ZeRO slice: the group it was cut over (its norm's squares are summed over it); None: not a slice
    zero_group: str | None = None
    #: DualPipe's second copy of a part another pp rank holds too (schedules/dualpipe.py): equal to the
    #: first after every step, so its norm's squares and its checkpoint pieces are the first copy's
    pipeline_copy: bool = False

    def decayed(self, numel: int) -> list[tuple[int, int]]:
        """The ranges weight decay shrinks in a tensor of `numel` elements."""
        return [(0, numel)] if self.decay_ranges is None else list(self.decay_ranges)

    def decays(self, numel: int) -> bool:
        """Whether weight decay shrinks any of it."""
        return bool(self.decayed(numel))


#: a plain, whole tensor's facts (`ParamTable.plain`): decayed whole, replicated
PLAIN = ParamFacts()


class UnknownParameterError(KeyError):
    """A ParamTable was asked about a tensor it does not list: most likely a parameter recreated after the
    table was built (a cast, a compile, a materialisation), whose facts would otherwise silently read as
    plain (a tp shard's norm summed wrong, a matrix left undecayed, the checkpoint's owner misjudged)."""

    def __str__(self) -> str:  # KeyError's own quotes its message as a key
        return str(self.args[0])


class ParamTable(Mapping[torch.Tensor, ParamFacts]):
    """Facts by parameter (by identity: the Parameter objects the model holds). Strict: asking about a
    tensor it does not list raises UnknownParameterError — every tensor has its facts said, never assumed.
    A piece built on its own (a test, a standalone optimizer) is handed `ParamTable.plain(params)`."""

    def __init__(self, facts: Mapping[torch.Tensor, ParamFacts]) -> None:
        self._facts: dict[int, tuple[torch.Tensor, ParamFacts]] = {
            id(t): (t, f) for t, f in facts.items()
        }

    @classmethod
    def plain(cls, params: Iterable[torch.Tensor]) -> ParamTable:
        """Every one of `params` plain (`PLAIN`: decayed whole, replicated): torch's view of them."""
        return cls(dict.fromkeys(params, PLAIN))

    def __getitem__(self, t: torch.Tensor) -> ParamFacts:
        entry = self._facts.get(id(t))
        if entry is None:
            raise UnknownParameterError(
                f"no facts for a tensor of shape {tuple(t.shape)} ({t.dtype}) among the table's "
                f"{len(self)}: the table was built before this parameter was recreated (a cast, a "
                "compile, a materialisation after the table was made?). Build the facts from the "
                "model's final parameters (engine/parallelize.param_facts), or hand a piece built on "
                "its own ParamTable.plain(params)."
            )
        return entry[1]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (t for t, _ in self._facts.values())

    def __len__(self) -> int:
        return len(self._facts)

    def __contains__(self, t: object) -> bool:
        return id(t) in self._facts


def merged(*tables: Mapping[torch.Tensor, ParamFacts]) -> ParamTable:
    """One table holding every entry of `tables` (a later table's entry wins)."""
    return ParamTable({t: f for table in tables for t, f in table.items()})
