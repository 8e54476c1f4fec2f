"""What is wrong with a learner's `tp_mlp` on the simulated ranks (exercises/tp_simulation.py), in a
learner's words: an exception (a shape error gets the split's rule), collectives the ranks called in different
orders or not at all (the rank and the all-reduce), then the numbers against one process. A wrong output is read
first for a wrong split — which rows and columns of w1 and w2 each rank's gradients show it used — and then
against what the typical mistakes compute: the rank's own hidden units' partial sum (the missing g), GELU after
the sum; a wrong gradient of x against the rank's own units' contribution (the missing f) or t × the sum."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from workbench.exercises.simulated_ranks import Deadlock, raised, stopped
from workbench.exercises.tp_simulation import (
    FFN,
    HIDDEN,
    TOKENS,
    BadOutput,
    Found,
    Mismatch,
    MLPData,
    Simulation,
    close,
    mlp,
    one_process,
    partial,
)


def split_rule(n: int) -> str:
    """How Megatron splits the MLP over n ranks, with the shapes."""
    per = FFN // n  # the hidden units on each rank, 4h/t
    return (
        "Column-parallel (the first layer) splits w1's output features, its rows: rank j takes "
        f"w1[j·4h/t:(j+1)·4h/t], [4h/t, h] = [{per}, {HIDDEN}], and x·w1_jᵀ is its [tokens, 4h/t] = "
        f"[{TOKENS}, {per}] hidden units, whole. Row-parallel (the second) splits w2's input features, its "
        f"columns: rank j takes w2[:, j·4h/t:(j+1)·4h/t], [h, 4h/t] = [{HIDDEN}, {per}], the same hidden "
        "units; its product is a partial sum of the whole [tokens, h] output, which g sums."
    )


def used(grad: torch.Tensor | None, dim: int) -> list[int]:
    """The indices along `dim` where a rank's gradient of a full weight is not zero: the part it used."""
    if grad is None:
        return []
    return torch.nonzero(grad.abs().sum(1 - dim)).flatten().tolist()


def span(indices: list[int]) -> str:
    if indices and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}–{indices[-1]}"
    head = ", ".join(str(i) for i in indices[:4])
    return f"{head}, … ({len(indices)} in all)" if len(indices) > 4 else head


def _which(label: str) -> str:
    """A traced all-reduce's label ("g forward", "f backward") in words."""
    op, _, direction = label.partition(" ")
    return f"{op}'s all-reduce in {direction}" if direction else label


def communication_problem(sim: Simulation, fn: Any) -> str | None:
    """An exception, mismatched collectives or a deadlock on the simulated ranks, in a learner's words."""
    ended = stopped(sim.errors)
    if ended is not None:
        return ended
    errors = {r: e for r, e in sim.errors.items() if not isinstance(e, (Deadlock, Mismatch))}
    if errors:
        r, e = min(errors.items())
        if isinstance(e, BadOutput):
            return f"rank {r}: {e}"
        message = f"rank {r} raised {raised(e, fn)}"
        if "process group" in str(e):
            return f"{message}: communicate through tp.f and tp.g only (they are traced, and simulated here)"
        return f"{message}. {split_rule(sim.n)}" if "shape" in str(e) else message
    mismatched = [e for e in sim.errors.values() if isinstance(e, Mismatch)]
    if mismatched:
        calls = mismatched[0].calls
        met = "; ".join(f"rank {c.rank} at {_which(c.label)}, {list(c.shape)}" for c in calls)
        return (
            f"the ranks met at all-reduce number {calls[0].k + 1} doing different things — "
            f"{met}. A collective is matched by its order alone (NCCL would sum the wrong tensors or hang): "
            "every rank calls f and g the same number of times, in the same order, on the same shapes."
        )
    waiting = {r: e for r, e in sim.errors.items() if isinstance(e, Deadlock)}
    if waiting:
        r = min(waiting)
        call = waiting[r].detail
        made = [len(calls) for calls in sim.calls]
        return (
            f"deadlock: rank {r} waits at its all-reduce number {call.k + 1} ({_which(call.label)}) while the "
            f"ranks made {made} all-reduces in all (rank 0, 1, …): every rank must call f and g, as many "
            "times each (an `if tp.rank == 0:` around one leaves the other ranks waiting)."
        )
    return None


def split_problem(found: list[Found]) -> str | None:
    """A wrong split, read from which rows and columns of w1 and w2 each rank's gradients show it used."""
    rows1 = [used(f.w1_grad, 0) for f in found]
    rule = split_rule(len(found))
    for r, f in enumerate(found):
        cols1, rows2, cols2 = used(f.w1_grad, 1), used(f.w2_grad, 0), used(f.w2_grad, 1)
        if not rows1[r] or not cols2:
            return (
                f"rank {r}'s {'w1' if not rows1[r] else 'w2'} received no gradient: compute with slices of "
                "w1 and w2 themselves (not .data, .detach() or a copy), so that backward reaches them"
            )
        if len(cols1) < HIDDEN:
            return (
                f"rank {r} used columns {span(cols1)} of w1, its input features: that is a row-parallel "
                f"split. {rule} Split by its input features, each rank's x·w1ᵀ is a partial sum of every "
                "hidden unit's input, and GELU of a partial sum is not a part of GELU of the sum "
                "(gelu(a) + gelu(b) ≠ gelu(a + b))."
            )
        if len(rows2) < HIDDEN:
            return (
                f"rank {r} used rows {span(rows2)} of w2, its output features: that is a column-parallel "
                f"split. {rule}"
            )
        if len(rows1[r]) == FFN:
            return (
                f"rank {r} used all {FFN} rows of w1 (every hidden unit): with tensor parallelism each rank "
                f"computes its own 4h/t = {FFN // len(found)}. {rule}"
            )
        if rows1[r] != cols2:
            return (
                f"rank {r} computes hidden units {span(rows1[r])} (rows of w1) but multiplies columns "
                f"{span(cols2)} of w2: the row-parallel layer takes the hidden units the column-parallel one "
                "made on the same rank"
            )
    for r in range(len(found)):
        for q in range(r):
            both = sorted(set(rows1[q]) & set(rows1[r]))
            if both:
                return (
                    f"ranks {q} and {r} both compute hidden units {span(both)} (rows of w1): each hidden unit "
                    "belongs to one rank — rank j takes block j (tp.rank) of the 4h/t-row blocks"
                )
    return None


def output_problem(d: MLPData, ref: Found, f: Found, r: int, *, n: int) -> str:
    """Why rank r of n's output differs from one process's (its split is clean)."""
    units = used(f.w1_grad, 0)
    mine, _ = partial(d, units, torch.zeros(TOKENS, HIDDEN, dtype=torch.float64))
    if close(f.y, mine):
        return (
            f"rank {r}'s output is a partial sum over its {len(units)} of the {FFN} hidden units "
            f"({span(units)}): g, the all-reduce after the row-parallel matmul, is missing. Every hidden unit "
            "contributes to every output value; g sums the ranks' parts, so that each rank holds the whole "
            "[tokens, h] output."
        )
    if close(f.y, n * ref.y):
        return (
            f"rank {r}'s output is {n} × one process's: it was summed over the ranks when it was already "
            "whole (g applied twice, or to an output every rank computed whole)"
        )
    if close(f.y, F.gelu(F.linear(F.linear(d.x, d.w1), d.w2))) or close(f.y, F.gelu(ref.y)):
        return (
            f"rank {r}'s output is GELU of the summed output: GELU was applied after g. It goes between the "
            "two matmuls, on each rank's own hidden units — it is elementwise, so no rank needs another's "
            "units for it — and g comes last, after the row-parallel matmul."
        )
    summed_x = n * d.x  # what g's forward makes of x: the sum of the n ranks' (equal) x
    if close(f.y, mlp(summed_x, d.w1[units], d.w2[:, units])) or close(
        f.y, mlp(summed_x, d.w1, d.w2)
    ):
        return (
            f"rank {r}'s output is the MLP of t·x = {n}·x: g was applied to the input — its forward "
            f"all-reduce summed x over the {n} ranks, which all hold the same x. f goes before the first "
            "linear (identity forward: each rank multiplies x as it is; its backward sums x's gradient), g "
            "after the second (its forward sums the ranks' partial outputs)."
        )
    err = float((f.y - ref.y).abs().max())
    message = (
        f"rank {r}'s output differs from one process's GELU(x·w1ᵀ)·w2ᵀ by up to {err:.3g} (its largest value "
        f"is {float(ref.y.abs().max()):.3g})"
    )
    if close(f.y, F.linear(F.gelu(F.linear(d.x, d.w1), approximate="tanh"), d.w2)):
        return (
            f"{message}: it is the MLP with GELU's tanh approximation. GELU here is "
            "torch.nn.functional.gelu, exact (approximate='none')"
        )
    return message


def units_problem(found: list[Found]) -> str | None:
    """Where the output is right and w1 is whole on each rank or split by its rows: hidden units not split
    evenly over the ranks (every rank computing all of them, or a fixed number of ranks' worth)."""
    if any(0 < len(used(f.w1_grad, 1)) < HIDDEN for f in found):
        return None  # w1 split by its input features, the hidden layer summed: the target tells it
    counts = [len(used(f.w1_grad, 0)) for f in found]
    n = len(found)
    if all(c == FFN for c in counts):
        return (
            f"every rank computed all {FFN} hidden units (rows of w1): no split happened — each rank ran the "
            "whole MLP, and the output is right only because the ranks computed the same thing. With tensor "
            f"parallelism each rank computes its own 4h/t = {FFN // n} (w1's rows, w2's columns of block "
            f"tp.rank), and g sums their partial outputs. {split_rule(n)}"
        )
    if any(c != FFN // n for c in counts):
        return (
            f"the output is right, but your {n} ranks computed {counts} hidden units (rows of w1): each "
            f"computes its own 4h/t = {FFN} / {n} = {FFN // n}. Cut by tp.size and tp.rank, not by a fixed "
            "number of ranks."
        )
    return None


def gradient_problem(d: MLPData, ref: Found, found: list[Found]) -> str | None:
    """x's gradient on each rank, then each rank's gradients of the weights where it used them."""
    grad_y = (ref.y - d.target) / TOKENS  # the loss's gradient at the (correct) output
    assert ref.x_grad is not None
    for r, f in enumerate(found):
        if close(f.x_grad, ref.x_grad):
            continue
        if f.x_grad is None:
            return (
                f"x received no gradient on rank {r}: the first matmul must take f(x), x itself, so that "
                "backward reaches it"
            )
        units = used(f.w1_grad, 0)
        _, own = partial(d, units, grad_y)
        if close(f.x_grad, own):
            return (
                f"the output is right, but x's gradient on rank {r} holds only the contribution of its own "
                f"{len(units)} hidden units ({span(units)}): f's backward all-reduce is missing. Every hidden "
                "unit depends on all of x, so x's gradient is a sum over every rank's units; f(x), before the "
                "column-parallel matmul, is the identity forward and sums x's gradient over the ranks in "
                "backward."
            )
        if close(f.x_grad, len(found) * ref.x_grad):
            return (
                f"x's gradient on rank {r} is {len(found)} × one process's: it was summed over the ranks when it "
                "was already whole (f applied twice)"
            )
        err = float((f.x_grad - ref.x_grad).abs().max())
        return (
            f"x's gradient on rank {r} differs from one process's by up to {err:.3g} (its largest value is "
            f"{float(ref.x_grad.abs().max()):.3g})"
        )
    for r, f in enumerate(found):
        for name, mine, want in (("w1", f.w1_grad, ref.w1_grad), ("w2", f.w2_grad, ref.w2_grad)):
            assert mine is not None and want is not None
            where = mine != 0
            if close(mine[where], want[where]):
                continue
            ratio = float((mine[where] * want[where]).sum() / (want[where] ** 2).sum())
            return (
                f"rank {r}'s gradient of {name}, on the entries it used, is {ratio:.3g} × one process's: each "
                "rank's gradient of its shard must be one process's there, or the ranks train another model"
            )
    return None


def diagnose(sim: Simulation, fn: Any) -> str | None:
    """What is wrong on the simulated ranks, in a learner's words; None when each matches one process."""
    problem = communication_problem(sim, fn)
    if problem is not None:
        return problem
    found = [f for f in sim.found if f is not None]
    ref = one_process(sim.data, sim.data.w1, sim.data.w2)
    for r, f in enumerate(found):
        if not close(f.y, ref.y):
            return split_problem(found) or output_problem(sim.data, ref, f, r, n=sim.n)
    return units_problem(found) or gradient_problem(sim.data, ref, found)
