"""Exercise `tensor-parallel`: the MLP GELU(x·w1ᵀ)·w2ᵀ split over t ranks as Megatron-LM splits it (Shoeybi et
al. 2019, arXiv 1909.08053, §3), written by the learner as `tp_mlp(x, w1, w2, tp)`:

        x ──f──▶ x·w1_jᵀ ──GELU──▶ ·w2_jᵀ ──g──▶ y          rank j of t
        column-parallel: w1_j = w1's rows j·4h/t … (j+1)·4h/t − 1 (its output features: whole hidden units)
        row-parallel:    w2_j = w2's columns, the same hidden units (its input features): a partial sum of y
        f: identity forward, all-reduce of x's gradient backward;  g: all-reduce forward, identity backward

The learner is handed the FULL weights (leaves, nn.Linear's layout) and cuts the shards itself — the split's
direction is the classic mistake — and `tp.f`, `tp.g`: parallel/tp_communications.py's copy_to_tp and
reduce_from_tp, the engine's own. Graded in three stages:

- on **simulated ranks** first (exercises/tp_simulation.py: t = 2 threads, then t = 4 so that a fixed 2 in
  place of tp.size fails; the same f and g over a stand-in communicator): an exception, a deadlock or
  mismatched collectives, and a wrong output or gradient stop it before any process starts, diagnosed from
  what each rank computed — which rows and columns of w1 and w2 its gradients show it used (a wrong split,
  or none: every rank computing every hidden unit), and whether its output is its own hidden units' partial
  sum (the missing g), the MLP of t·x (g on the input, f and g swapped), or its x gradient its own units'
  contribution (the missing f);
- on **real ranks** (gloo, t = 2), 3 SGD steps traced: the output, the gradients of x, w1 and w2 (each rank's
  shard of the full weights' gradients) and the losses against one process's;
- against the **target**, measured from the trace: one all-reduce forward (g) and one backward (f) per MLP,
  each of the [tokens, h] activation. An answer that sums the [tokens, 4h] hidden layer instead (w1 split by
  its input features, the all-reduce before GELU) is correct and fails it: 4 × the bytes.

The tolerance, RTOL = 1e-9 relative in float64, is justified in exercises/tp_simulation.py; the diagnosis is
exercises/tp_diagnosis.py.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.exercises.exercise import Exercise
from workbench.exercises.result import Result, Row
from workbench.exercises.tp_diagnosis import diagnose
from workbench.exercises.tp_simulation import (
    FFN,
    HIDDEN,
    RANKS,
    RTOL,
    SIMULATED,
    TOKENS,
    TP,
    data,
    leaves,
    loss_of,
    one_process,
    simulate,
)
from workbench.parallel.tp_communications import TPContext

#: SGD steps on the real ranks, and their learning rate
STEPS, LR = 3, 0.5
#: the activation f and g each sum once per MLP: [tokens, h] in float64
ACTIVATION_BYTES = TOKENS * HIDDEN * 8


def relative(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """max |a − b| / max |b|; infinite when a is missing."""
    if a is None or b is None:
        return float("inf")
    return float((a - b).abs().max()) / float(b.abs().max())


def on_rank(ctx: Any, fn: Any, settings: dict) -> dict:
    """One real rank: STEPS SGD steps of the learner's (or the reference's) MLP on the full weights, each
    compared with one process's MLP on its own copy of them (computed outside the traced step)."""
    from workbench.exercises.on_rank import traced_step

    tp = TP(TPContext(comm=ctx.comm, rank=ctx.comm.index("tp"), size=ctx.comm.size("tp")))
    d = data()
    x, w1, w2 = leaves(d.x, d.w1, d.w2)
    ref_w1, ref_w2 = d.w1.clone(), d.w2.clone()
    worst: dict[str, float] = {}
    losses, ref_losses = [], []
    for step in range(STEPS):
        ref = one_process(d, ref_w1, ref_w2)
        with traced_step(ctx, step):
            with ctx.recorder.span("forward", "forward", "compute", step=step, microbatch=0):
                y = fn(x, w1, w2, tp)
                loss = loss_of(y, d.target)
            with ctx.recorder.span("backward", "backward", "compute", step=step, microbatch=0):
                loss.backward()
        assert w1.grad is not None and w2.grad is not None and ref.w1_grad is not None
        assert ref.w2_grad is not None
        on1, on2 = w1.grad != 0, w2.grad != 0  # this rank's shards: compared where it used them
        found = {
            "output": relative(y.detach(), ref.y),
            "x gradient": relative(x.grad, ref.x_grad),
            "w1 gradient": relative(w1.grad[on1], ref.w1_grad[on1]),
            "w2 gradient": relative(w2.grad[on2], ref.w2_grad[on2]),
        }
        worst = {k: max(v, worst.get(k, 0.0)) for k, v in found.items()}
        losses.append(float(loss))
        ref_losses.append(float(loss_of(ref.y, d.target)))
        with torch.no_grad():
            w1 -= LR * w1.grad
            w2 -= LR * w2.grad
            ref_w1 -= LR * ref.w1_grad
            ref_w2 -= LR * ref.w2_grad
        x.grad = w1.grad = w2.grad = None
    worst["losses"] = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    return {"worst": worst, "losses": losses, "one_process_losses": ref_losses}


def grade(solution: Any, out: str) -> Result:
    """Validate on simulated ranks, run beside the reference on real ones, hold to one all-reduce each way."""
    from workbench.config import RunConfig
    from workbench.exercises.grading import at_sizes, grade_function

    def simulated(fn: Any) -> str | None:
        return at_sizes(
            fn,
            sizes=SIMULATED,
            check=lambda f, n: diagnose(simulate(f, n), f),
            size_name="tp.size",
        )

    return grade_function(
        "tensor-parallel",
        solution,
        function="tp_mlp",
        params=("x", "w1", "w2", "tp"),
        simulated=simulated,
        config=RunConfig(tp=RANKS, global_batch=1),
        judge=judge,
        out=out,
    )


def all_reduces(run: Any) -> dict[str, tuple[int, int]]:
    """From the trace: per direction, the most all-reduces over tp any rank made in a step, and their bytes."""
    ev = run.events
    ar = ev[(ev.cat == "collective") & (ev.op == "all_reduce") & (ev.group == "tp")]
    most: dict[str, tuple[int, int]] = {}
    for direction in ("forward", "backward"):
        mine = ar[ar.label.astype(str).str.endswith(direction)]
        per_step = mine.groupby(["rank", "step"])["bytes"].agg(["count", "sum"])
        every = [(r, s) for r in range(RANKS) for s in range(STEPS)]
        per_step = per_step.reindex(every, fill_value=0)
        most[direction] = (int(per_step["count"].max()), int(per_step["sum"].max()))
    return most


def _count(n: int) -> str:
    return f"{n} all-reduce{'' if n == 1 else 's'}"


def judge(yours: Any, reference: Any) -> Result:
    """The real runs against one process (output, gradients, losses) and the target (all-reduces, bytes)."""
    from workbench.exercises.ranks import rank_results

    mine = rank_results(yours)
    worst = {k: max(m["worst"][k] for m in mine) for k in mine[0]["worst"]}
    largest = max(worst, key=lambda k: worst[k])
    correct = worst[largest] <= RTOL
    ops = all_reduces(yours)
    rows = [
        Row(
            what=f"largest difference from one process, relative ({largest})",
            yours=worst[largest],
            target=f"≤ {RTOL:g}",
            ok=correct,
        ),
        Row(
            what=f"loss at the last of {STEPS} SGD steps (target: one process's)",
            yours=mine[0]["losses"][-1],
            target=mine[0]["one_process_losses"][-1],
            ok=worst["losses"] <= RTOL,
        ),
    ]
    for direction, op in (("forward", "g"), ("backward", "f")):
        count, nbytes = ops[direction]
        rows += [
            Row(
                what=f"all-reduces per MLP, {direction} ({op})",
                yours=count,
                target=1,
                ok=count == 1,
                measured=True,
            ),
            Row(
                what=f"bytes all-reduced per MLP, {direction}",
                yours=nbytes,
                target=ACTIVATION_BYTES,
                ok=nbytes == ACTIVATION_BYTES,
                measured=True,
            ),
        ]
    verdict = {"rows": rows, "learner": yours, "reference": reference}
    if not correct:
        message = (
            f"on the real ranks the {largest} differs from one process's by {worst[largest]:.3g} (relative; "
            f"allowed {RTOL:g}), though the simulated ranks agreed"
        )
        return Result(
            exercise="tensor-parallel",
            passed=False,
            stage="one process",
            message=message,
            **verdict,
        )
    (nf, bf), (nb, bb) = ops["forward"], ops["backward"]
    if nf == nb == 0:
        message = (
            "your MLP computes what one process does, but the ranks never communicated: each computed the "
            "whole MLP, one process's work on every rank. Tensor parallelism splits it — each rank computes "
            f"4h/t = {FFN // RANKS} of the {FFN} hidden units — at the cost of one all-reduce each way of the "
            f"[tokens, h] activation, {ACTIVATION_BYTES} bytes."
        )
        return Result(
            exercise="tensor-parallel", passed=False, stage="target", message=message, **verdict
        )
    if any(ops[d] != (1, ACTIVATION_BYTES) for d in ops):
        message = (
            f"your MLP computes what one process does, but each step all-reduced {bf} bytes in forward "
            f"({_count(nf)}) and {bb} in backward ({_count(nb)}); the target is one all-reduce each way of the "
            f"[tokens, h] = [{TOKENS}, {HIDDEN}] activation, {ACTIVATION_BYTES} bytes. Split w1 by its rows "
            "(column-parallel) and the hidden layer stays split: GELU is elementwise, so each rank applies it "
            "to its own units without communicating, and only the row-parallel output's partial sums need "
            "summing (g) — in backward, only x's gradient (f). Summing the [tokens, 4h] hidden layer's inputs instead "
            "costs 4 × the bytes."
        )
        return Result(
            exercise="tensor-parallel", passed=False, stage="target", message=message, **verdict
        )
    message = (
        f"every rank's output, gradients and losses equal one process's over {STEPS} SGD steps (within "
        f"{worst[largest]:.2g}), with one all-reduce forward (g) and one backward (f) of the [tokens, h] "
        f"activation, {ACTIVATION_BYTES} bytes each: Megatron's two all-reduces per MLP"
    )
    return Result(
        exercise="tensor-parallel", passed=True, stage="passed", message=message, **verdict
    )


EXERCISE = Exercise(
    name="tensor-parallel",
    title="Tensor parallelism: a column- then row-parallel MLP with f and g",
    you_write="tp_mlp(x, w1, w2, tp): your shards of w1 and w2, f before the first matmul and g after the second",
    target="one all-reduce forward and one backward per MLP, each of the [tokens, h] activation",
    task=(
        "Write the MLP GELU(x·w1ᵀ)·w2ᵀ split over t ranks as Megatron-LM splits it (Shoeybi et al. 2019, §3): "
        "the first linear column-parallel, the second row-parallel, with f and g in their places.\n\n"
        "```python\ndef tp_mlp(x, w1, w2, tp):\n    ...\n    return y\n```\n\n"
        "- `x` [tokens, h]: the input, the same on every rank (float64);\n"
        "- `w1` [4h, h] and `w2` [h, 4h]: the FULL weights in nn.Linear's layout (x·w1ᵀ): take this rank's "
        "shards by slicing them (their gradients then land in the full weights' places);\n"
        "- `tp.rank`, `tp.size`: this rank j, and t;\n"
        "- `tp.f(a)`: identity forward, all-reduce (sum) of a's gradient backward; `tp.g(a)`: all-reduce "
        "(sum) of a forward, identity backward.\n\n"
        "Return the output [tokens, h], the whole of it on every rank; GELU is `torch.nn.functional.gelu`. "
        "Your function has only `torch` and `math` as globals, and communicates only through `tp.f` and "
        "`tp.g`.\n\n"
        f"Here tokens = {TOKENS}, h = {HIDDEN} (4h = {FFN}) and t = {RANKS}. "
        f"It runs first on t = {RANKS} and t = {SIMULATED[1]} simulated ranks (a missing f or g, a wrong "
        f"split, a deadlock is named before any process starts), then on {RANKS} gloo processes for "
        f"{STEPS} SGD steps, traced: the "
        "output, the gradients of x, w1 and w2 (each rank's shard) and the losses must equal one process's "
        f"(relative {RTOL:g}, in float64). Target, measured from the trace: one all-reduce forward and one "
        "backward per MLP, each of the [tokens, h] activation."
    ),
    stub=(
        "def tp_mlp(x, w1, w2, tp):\n"
        "    # your code: your shards of w1 and w2, f and g in their places\n"
        "    ...\n"
    ),
    grade=grade,
)
