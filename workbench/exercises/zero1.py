"""Exercise `zero1`: the ZeRO-1 step (Rajbhandari et al. 2020, arXiv 1910.02054), written by the learner:
reduce-scatter the gradients, update this rank's shard, all-gather the parameters.

The learner's `zero1_step(flat_params, flat_grads, dp, update)` gets the model's parameters and gradients as
one flat fp32 buffer each (parallel/flat.py's layout: the model's parameters are views into `flat_params`, as
the engine's ZeRO buckets make them; the length divides by n), `dp` (`rank`, `size`, `reduce_scatter(out,
inp)`, `all_gather(out, inp)`, `all_reduce(t)`: sums, like torch's) and `update(shard_params, shard_grads)`,
AdamW on one shard, in place, whose moments it makes on its first call — so the optimizer state a rank holds
is as big as what the learner hands it. Graded in three stages:

- on **simulated ranks** in this process first (exercises/zero1_simulated.py: a thread per rank, the
  collectives done between them; n = 4, then n = 3, so that a fixed 4 in place of dp.size fails): an
  exception, a mismatched or missing collective, a loop that does not end, and the three typical slips are
  named before any process starts — the update given the sum of the ranks' gradients (n× one
  process's: the average is missing), a rank updating a shard it does not own (its slice against the one it
  owns), and the all-gather left out (how many values each rank holds stale). The parameters are random, so
  the slice a rank updated is found from its values, whether the learner passes a view or a copy;
- on **real ranks** (gloo, 4 processes): a small MLP trained STEPS steps from a fixed seed, each rank on its
  quarter of the batch, the learner's step traced through the communicator; its losses and final parameters
  compared with one process training on the whole batch (ONE_PROCESS_RTOL), every rank's parameters
  compared with the others' after every step;
- against the **targets**, measured: the bytes a rank puts on the wire a step (from the trace) ≤ 2(n−1)/n·S,
  what plain data parallelism's all-reduce sends — ZeRO-1 costs no extra communication — and the optimizer
  state a rank holds (its tensors' bytes) = 1/n of the whole model's. All-reducing the whole gradient and then
  updating the shard is correct and sends 3(n−1)/n·S; updating the whole model on every rank is plain data
  parallelism and holds n× the state.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.exercises.exercise import Exercise
from workbench.exercises.result import Result, Row
from workbench.exercises.zero1_simulated import RANKS, SIMULATED, ShardAdamW, diagnose, simulate
from workbench.trace.bandwidth import bus_factor

#: the real run (on RANKS ranks): steps, samples a step over all ranks, the MLP's widths
STEPS, BATCH, WIDTH, HIDDEN = 4, 32, 16, 32
#: losses and parameters against one process. fp32 arithmetic only reorders: n partial gradient sums
#: added then divided by n, against one sum over the batch — measured 5e-8 (losses) and 1e-7 (parameters;
#: the test holds both below 1e-6); AdamW is elementwise, so a shard updates bit for bit as the whole
#: buffer would. 1e-5 leaves 100× headroom, while a step here moves the loss by ~10 % (0.54, 0.46, 0.42, 0.37)
ONE_PROCESS_RTOL = 1e-5


# ---- real ranks --------------------------------------------------------------------------------------------
def build(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The model every rank starts from and the STEPS batches: (model, inputs, targets)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, WIDTH)
    )
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(STEPS, BATCH, WIDTH, generator=g)
    mix = torch.randn(WIDTH, WIDTH, generator=g) / WIDTH**0.5
    return model, x, torch.sin(x @ mix)


def train(fn: Any, *, dp: Any, ctx: Any = None) -> dict[str, Any]:
    """STEPS steps of `fn` on this rank's 1/n of each batch (dp.size = 1: one process, the whole batch): the
    per-step local losses, the final parameters, the optimizer state's bytes. With `ctx` (a real rank) each
    step is traced (forward, backward, the learner's collectives, the update) and followed by the grader's
    look at how many values the ranks' parameters differ in."""
    from contextlib import nullcontext

    from workbench.exercises.on_rank import traced_step
    from workbench.parallel.flat import flatten_params, grads_as_views

    def span(name: str, cat: str, step: int) -> Any:
        return nullcontext() if ctx is None else ctx.recorder.span(name, cat, "compute", step=step)

    n, rank = dp.size, dp.rank
    model, x, y = build()
    params = list(model.parameters())
    flat = flatten_params(params, multiple=n)  # the model's parameters are views into it
    grads = torch.zeros_like(flat)
    grads_as_views(params, grads)  # backward accumulates into it
    update = ShardAdamW(recorder=None if ctx is None else ctx.recorder)
    losses, differ = [], []
    part = slice(rank * BATCH // n, (rank + 1) * BATCH // n)
    for step in range(STEPS):
        with nullcontext() if ctx is None else traced_step(ctx, step):
            grads.zero_()
            with span("forward", "forward", step):
                loss = torch.nn.functional.mse_loss(model(x[step, part]), y[step, part])
            with span("backward", "backward", step):
                loss.backward()
            fn(flat, grads, dp, update)
        losses.append(float(loss.detach()))
        differ.append(0 if ctx is None else ranks_differ(flat))
    return {
        "losses": losses,
        "differ": differ,
        "params": flat.tolist(),
        "state_bytes": update.state_bytes,
        "model_bytes": flat.numel() * flat.element_size(),
    }


def ranks_differ(flat: torch.Tensor) -> int:
    """The grader's own look (torch.distributed directly: not traced, not counted in the bytes): in how many
    values the ranks' parameters differ from rank 0's."""
    import torch.distributed as dist

    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat.detach().clone())
    return int((torch.stack(every) != every[0]).any(0).sum())


class OneProcess:
    """`dp` for one process: n = 1, its collectives copy."""

    rank, size = 0, 1

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        out.copy_(inp)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        out.copy_(inp)

    def all_reduce(self, t: torch.Tensor) -> None:
        pass


class TracedDP:
    """The real ranks' `dp`: each collective through the traced communicator (a span on the comm lane with
    its bytes), over the data-parallel group."""

    def __init__(self, ctx: Any, label: str) -> None:
        self.comm, self.label = ctx.comm, label
        self.rank, self.size = ctx.comm.index("dp"), ctx.comm.size("dp")

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.comm.reduce_scatter(out, inp, "dp", label=self.label)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.comm.all_gather(out, inp, "dp", label=self.label)

    def all_reduce(self, t: torch.Tensor) -> None:
        self.comm.all_reduce(t, "dp", label=self.label)


def on_rank(ctx: Any, fn: Any, settings: dict) -> dict:
    """One real rank: STEPS training steps with the learner's (or the reference's) ZeRO-1 step."""
    return train(fn, dp=TracedDP(ctx, settings["label"]), ctx=ctx)


# ---- the grade --------------------------------------------------------------------------------------------
def grade(solution: Any, out: str) -> Result:
    """Validate on simulated ranks, run beside the reference on real ones, hold to one process and the targets."""
    from workbench.config import RunConfig
    from workbench.exercises.grading import at_sizes, grade_function

    def simulated(fn: Any) -> str | None:
        return at_sizes(
            fn,
            sizes=SIMULATED,
            check=lambda f, n: diagnose(simulate(f, n), f),
            size_name="dp.size",
        )

    return grade_function(
        "zero1",
        solution,
        function="zero1_step",
        params=("flat_params", "flat_grads", "dp", "update"),
        simulated=simulated,
        config=RunConfig(dp=RANKS, global_batch=RANKS),
        judge=judge,
        out=out,
    )


def wire_bytes(run: Any) -> int:
    """The most bytes one rank put on the wire in a step: each collective of the steps, from the trace, times
    its ring factor (trace/bandwidth.py: 2(n−1)/n for an all-reduce, (n−1)/n for the others)."""
    ev = run.events
    ops = ev[(ev.cat == "collective") & ev.step.notna() & ev.op.notna()]
    sent = ops.apply(lambda e: e["bytes"] * bus_factor(e["op"], RANKS), axis=1)
    return int(round(sent.groupby(ops["rank"]).sum().max() / STEPS)) if len(ops) else 0


def judge(yours: Any, reference: Any) -> Result:
    """The real runs against one process (losses, parameters, ranks agreeing) and the two targets."""
    from workbench.exercises.ranks import rank_results

    mine = rank_results(yours)
    n = len(mine)
    alone = train(answer_for_one_process, dp=OneProcess())
    losses = [sum(m["losses"][s] for m in mine) / n for s in range(STEPS)]
    loss_off = max(abs(a - b) / abs(b) for a, b in zip(losses, alone["losses"], strict=True))
    ref_params = torch.tensor(alone["params"])
    param_off = max(
        float((torch.tensor(m["params"]) - ref_params).abs().max()) for m in mine
    ) / float(ref_params.abs().max())
    differ = max(max(m["differ"]) for m in mine)
    size = mine[0]["model_bytes"]
    sent, sent_target = wire_bytes(yours), 2 * (n - 1) * size // n
    state = max(m["state_bytes"] for m in mine)
    state_target = 2 * size // n  # two fp32 moments for 1/n of the values
    agrees = loss_off <= ONE_PROCESS_RTOL and param_off <= ONE_PROCESS_RTOL and differ == 0
    rows = [
        Row(
            what=f"losses against one process, largest relative difference over {STEPS} steps",
            yours=loss_off,
            target=ONE_PROCESS_RTOL,
            ok=loss_off <= ONE_PROCESS_RTOL,
        ),
        Row(
            what="final parameters against one process, largest difference / largest parameter",
            yours=param_off,
            target=ONE_PROCESS_RTOL,
            ok=param_off <= ONE_PROCESS_RTOL,
        ),
        Row(
            what="values in which ranks' parameters differ (worst step)",
            yours=differ,
            target=0,
            ok=differ == 0,
        ),
        Row(
            what="bytes a rank sent a step (most)",
            yours=sent,
            target=sent_target,
            ok=sent <= sent_target,
            measured=True,
        ),
        Row(
            what="optimizer state a rank holds, bytes (its moments' tensors)",
            yours=state,
            target=state_target,
            ok=state <= state_target,
            measured=True,
        ),
    ]

    def result(passed: bool, stage: str, message: str) -> Result:
        return Result(
            exercise="zero1",
            passed=passed,
            stage=stage,
            message=message,
            rows=rows,
            learner=yours,
            reference=reference,
        )

    if not agrees:
        if differ:
            return result(
                False,
                "one process",
                f"after a step the real ranks' parameters differ in {differ} values (the simulated ones "
                "agreed): every rank must end the step holding the whole update",
            )
        return result(
            False,
            "one process",
            f"the real ranks train a different model from one process on the whole batch: losses differ by "
            f"up to {loss_off:.2g} relative, parameters by {param_off:.2g} (held to {ONE_PROCESS_RTOL:g})",
        )
    if sent > sent_target:
        return result(
            False,
            "target",
            f"your step trains what one process does, but a rank sent {sent} bytes a step, "
            f"{sent / size:.2f} × the model's {size} bytes; ZeRO-1 sends 2(n−1)/n·S = {sent_target} "
            f"({sent_target / size:.2f} × S), what plain data parallelism's all-reduce sends: reduce-scatter "
            "the gradients ((n−1)/n·S) instead of all-reducing them (2(n−1)/n·S) — each rank needs only the "
            "sum of its own slice — then all-gather the parameters ((n−1)/n·S)",
        )
    if state > state_target:
        return result(
            False,
            "target",
            f"your step trains what one process does, but a rank holds {state} bytes of optimizer state, "
            f"{state / (2 * size):.2f} of the whole model's optimizer state ({2 * size} bytes: Adam's two "
            f"moments): ZeRO-1 keeps 1/n = {state_target} "
            "bytes a rank — give update only this rank's slice and its gradients",
        )
    return result(
        True,
        "passed",
        f"every rank trains what one process does on the whole batch, sending {sent} bytes a step "
        f"(2(n−1)/n·S, what plain data parallelism's all-reduce sends: ZeRO-1 costs no extra communication) and "
        f"holding {state} bytes of optimizer state, 1/n = 1/{n} of the whole model's ({2 * size} bytes: "
        "Adam's two moments)",
    )


def answer_for_one_process(flat_params, flat_grads, dp, update):
    """One process's step: AdamW on the whole buffer."""
    update(flat_params, flat_grads)


EXERCISE = Exercise(
    name="zero1",
    title="ZeRO-1: reduce-scatter the gradients, update your shard, all-gather the parameters",
    you_write="zero1_step(flat_params, flat_grads, dp, update): one rank's ZeRO-1 step",
    target="bytes a rank sends ≤ 2(n−1)/n·S (plain DP's); optimizer state a rank holds = 1/n of the model's",
    task=(
        "Write one rank's ZeRO-1 step (Rajbhandari et al. 2020). `flat_params` and `flat_grads` are the model's "
        "parameters and this rank's gradients (of its part of the batch) as one flat fp32 buffer each, S bytes, "
        "their length a multiple of n; the model's parameters are views into `flat_params`, so changing it "
        "in place changes the model. `dp.rank` is r, `dp.size` is n; `dp.reduce_scatter(out, inp)` sums `inp` "
        "over the ranks and leaves rank r the r-th 1/n of the sum in `out`; `dp.all_gather(out, inp)` "
        "concatenates every rank's `inp` into `out` in rank order; `dp.all_reduce(t)` sums `t` in place. "
        "`update(shard_params, shard_grads)` is AdamW on one shard, in place: it makes its moments on its "
        "first call, as big as what you give it. Rank r owns the r-th 1/n of the buffer.\n\n"
        "```python\ndef zero1_step(flat_params, flat_grads, dp, update):\n    n, r = dp.size, dp.rank\n"
        "    ...\n```\n\n"
        "When your function returns, every rank's `flat_params` must hold what one process's AdamW step on "
        "the whole batch gives (its loss is the mean over the whole batch). It runs first on 4 and on 3 "
        "simulated ranks (a missing average, a wrong shard, a missing all-gather are named before any process "
        "starts), then on 4 gloo processes training a small MLP for 4 steps, traced, beside one process. "
        "Targets, measured: each rank sends at most 2(n−1)/n·S bytes a step — what plain data parallelism's "
        "all-reduce sends — and holds 1/n of the optimizer state."
    ),
    stub=(
        "def zero1_step(flat_params, flat_grads, dp, update):\n"
        "    n, r = dp.size, dp.rank\n"
        "    # your code: reduce-scatter, update your shard, all-gather\n"
    ),
    grade=grade,
)
