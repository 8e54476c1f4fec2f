"""Exercise `buckets`: bucketed data parallelism (Li et al. 2020, the design of torch DDP) — the learner writes
the hook that fills gradient buckets and launches each bucket's all-reduce the moment it is full, so that the
communication runs while backward goes on producing the earlier layers' gradients.

The learner's `on_gradient(param, dp)` is called by autograd as each parameter's gradient is ready
(`register_post_accumulate_grad_hook`), in backward order. `dp` is `BucketHooks`: `dp.size` ranks,
`dp.buckets` (in reverse parameter order, the order backward fills them, as parallel/data_parallel.py cuts
them with config/buckets.plan_buckets), `dp.bucket_of(param)`, and `dp.all_reduce(bucket)`, which launches an
asynchronous all-reduce (a *sum*) of the bucket's gradients — each parameter's `.grad` is a view of its
bucket's flat buffer. Averaging over the ranks is the learner's: the optimizer wants the gradient of the
mean loss. Graded in three stages:

- **in this process** first: one backward of the model on a `dp` that only records when each bucket was
  launched and how full it was, its dp.size 3 (not the real run's 2, so that a fixed 2 fails). A bucket
  reduced more than once (a launch per gradient), launched before its last gradient arrived (naming the
  bucket and the gradients still to come), never launched, written after its launch, or divided by another
  number than dp.size stops it before any process starts;
- on **real ranks** (gloo, dp = 2): four SGD steps of the tiny GPT on half the global batch each, every
  all-reduce traced through the communicator (`all_reduce bucket k`, its bytes), beside **one process** that
  trains the same model on the whole batch: the losses and the final parameters must agree (a forgotten
  division by dp.size doubles the step);
- against the **target**, from the trace: every bucket reduced once a step, and all but the last launched
  before backward's last gradient arrived (the `backward` span ends there) — the overlap. A hook that waits
  for every gradient and then launches all the buckets is correct and still fails it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.exercises.bucket_hooks import Bucket, BucketHooks
from workbench.exercises.exercise import Exercise
from workbench.exercises.result import Result, Row
from workbench.exercises.submission import SolutionError, function_source, load

#: ranks, sequences in the global batch, SGD steps and learning rate, the data's seed, a bucket's capacity
DP, GLOBAL_BATCH, STEPS, LR, SEED = 2, 8, 4, 0.3, 0
#: the in-process check's dp.size: another than the real run's, so that a fixed 2 in place of dp.size fails
SIMULATED_DP = 3
#: 32 KiB cuts the tiny GPT's 118 KiB of gradients into five buckets
BUCKET_MB = 32 / 1024
#: the losses and parameters of dp = 2 and of one process differ by float32 reassociation (the sum of two
#: half-batch means ÷ 2 against one mean: ~1e-7 relative); a step twice too large moves the second step's
#: loss by ~1e-4 relative and the last one's by ~1e-2
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-5


def tokens() -> torch.Tensor:
    """The global batch: GLOBAL_BATCH sequences of seq_len + 1 tokens (inputs and shifted targets)."""
    from workbench.config.model_config import PRESETS

    cfg = PRESETS["tiny"]
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(0, cfg.vocab_size, (GLOBAL_BATCH, cfg.seq_len + 1), generator=g)


def model() -> nn.Module:
    """The tiny GPT (model/gpt.py), initialised from SEED: the same on every rank and in one process."""
    from workbench.config.model_config import PRESETS
    from workbench.model.gpt import GPT

    return GPT(PRESETS["tiny"], SEED)


@dataclass(kw_only=True)
class Simulation:
    dp: BucketHooks
    error: BaseException | None
    #: each bucket's gradients as backward makes them, before any hook (a backward with none)
    plain: list[torch.Tensor]


def simulate(fn: Any) -> Simulation:
    """One backward of the model on rank 0's half of the batch, in this process, with a `dp` of
    SIMULATED_DP ranks that records each launch and reduces nothing; beside it, the same backward with no
    hook (the gradients before the learner divides them)."""
    half = tokens()[: GLOBAL_BATCH // DP]
    bare = model()
    plain = BucketHooks(
        bare,
        size=SIMULATED_DP,
        launch=lambda _b: None,
        clock=time.perf_counter,
        bucket_mb=BUCKET_MB,
    )
    bare(half[:, :-1], half[:, 1:]).backward()
    net = model()
    dp = BucketHooks(
        net, size=SIMULATED_DP, launch=lambda _b: None, clock=time.perf_counter, bucket_mb=BUCKET_MB
    )
    dp.fn = fn
    dp.start()
    error = None
    try:
        net(half[:, :-1], half[:, 1:]).backward()
    except Exception as e:  # the learner's error, kept for the message
        error = e
    return Simulation(dp=dp, error=error, plain=[b.buffer.clone() for b in plain.buckets])


def divisor_problem(sim: Simulation) -> str | None:
    """A bucket whose gradients reached dp.all_reduce divided by something other than dp.size (1: not divided
    at all, is left to the real ranks, where the step against one process's names it)."""
    size = sim.dp.size
    for b, want in zip(sim.dp.buckets, sim.plain, strict=True):
        launched = next(x.snapshot for x in sim.dp.launches if x.bucket == b.index)
        ratio = float((launched * want).sum() / (want * want).sum())
        if abs(ratio - 1) <= 1e-4 or abs(ratio * size - 1) <= 1e-4:
            continue
        k = 1 / ratio if ratio > 0 else 0.0
        if k >= 1 and abs(k - round(k)) <= 1e-3 * k:
            said = f"divided by {round(k)}"
        else:
            said = f"as {ratio:.3g} × backward's gradients, not 1/{size} of them"
        return (
            f"bucket {b.index}'s gradients reached dp.all_reduce {said}; dp.size is {size} here (this check "
            f"simulates {size} ranks, the real run {DP}): divide by dp.size, so that the sum over the ranks is "
            "their mean whatever their number"
        )
    return None


def diagnose(sim: Simulation, fn: Any) -> str | None:
    """What is wrong with the launches of one simulated backward, in a learner's words; None when every
    bucket was launched once, full, and left alone after."""
    from workbench.exercises.simulated_ranks import raised

    if sim.error is not None:
        return f"your hook raised {raised(sim.error, fn)}"
    dp = sim.dp
    replaced = dp.replaced()
    if replaced:
        return (
            f"the gradient of {replaced[0]} is no longer a view of its bucket's buffer: your hook assigned "
            "a new tensor to param.grad (param.grad = param.grad / dp.size, say), which the bucket's "
            "all-reduce never sees. Change a gradient in place: param.grad.div_(dp.size)."
        )
    per = {b.index: [x for x in dp.launches if x.bucket == b.index] for b in dp.buckets}
    for b in dp.buckets:
        if len(per[b.index]) > 1:
            k = len(per[b.index])
            when = ", ".join(str(x.arrived) for x in per[b.index])
            return (
                f"bucket {b.index} was reduced {k} times in one backward (launched when {when} of its "
                f"{len(b.params)} gradients had arrived). Each all-reduce sends the whole bucket, so it went "
                f"on the wire {k} times, and a launch before its last gradient sums gradients that are not "
                "there yet. Launch a bucket once, when the last of its gradients has arrived."
            )
    for b in dp.buckets:
        if per[b.index] and per[b.index][0].missing:
            x = per[b.index][0]
            return (
                f"bucket {b.index} was launched when {x.arrived} of its {len(b.params)} gradients had "
                f"arrived (still to come: {', '.join(x.missing)}): its all-reduce would sum the ranks' "
                "buffers before backward has written those gradients into them, and each rank would keep "
                "its own. Launch it once all of bucket.params have arrived: count them in bucket.ready."
            )
    for b in dp.buckets:
        if not per[b.index]:
            return (
                f"bucket {b.index} was never launched (all {len(b.params)} of its gradients arrived; "
                f"bucket.ready held {len(b.ready)}): its gradients would stay this rank's own and the "
                "ranks' models would drift apart. Launch each bucket when its last gradient arrives."
            )
    for b in dp.buckets:
        moved = float((b.buffer - per[b.index][0].snapshot).abs().max())
        if moved > 0:
            return (
                f"bucket {b.index}'s gradients changed after dp.all_reduce launched it (by up to {moved:.3g}): "
                "the all-reduce is in flight and sends whatever the buffer holds when the backend reads "
                "it. Finish with a bucket (divide it by dp.size) before you launch it."
            )
    return divisor_problem(sim)


def gradients(net: nn.Module) -> list[torch.Tensor]:
    """A copy of each parameter's gradient (zeros where it has none)."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in net.parameters()]


def sgd(net: nn.Module) -> None:
    with torch.no_grad():
        for p in net.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-LR)


@dataclass(kw_only=True)
class Oracle:
    losses: list[float]
    model: nn.Module
    #: the first step's gradients
    first: list[torch.Tensor]


def one_process() -> Oracle:
    """The oracle: the same model trained on the whole global batch in this process."""
    net, batch = model(), tokens()
    losses: list[float] = []
    first: list[torch.Tensor] = []
    for _ in range(STEPS):
        loss = net(batch[:, :-1], batch[:, 1:])
        loss.backward()
        losses.append(float(loss))
        first = first or gradients(net)
        sgd(net)
        net.zero_grad(set_to_none=True)
    return Oracle(losses=losses, model=net, first=first)


def gradient_ratio(grads: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """`grads` as a multiple of one process's gradient `want` (projected on it): 1 for the mean of the
    ranks' gradients, 2 on two ranks for their sum."""
    dot = sum(float((g * w).sum()) for g, w in zip(grads, want, strict=True))
    return dot / sum(float((w * w).sum()) for w in want)


def on_rank(ctx: Any, fn: Any, settings: dict) -> dict:
    """One real rank: STEPS steps of the tiny GPT on its half of the batch with the learner's hook, every
    bucket's all-reduce traced; beside it, one process's training on the whole batch."""
    from workbench.exercises.on_rank import traced_step

    rec = ctx.recorder
    net, n = model(), ctx.comm.size("dp")
    per = GLOBAL_BATCH // n
    mine = tokens()[ctx.comm.index("dp") * per : (ctx.comm.index("dp") + 1) * per]

    def launch(bucket: Bucket) -> Any:
        return ctx.comm.all_reduce(
            bucket.buffer, "dp", async_op=True, label=f"bucket {bucket.index}"
        )

    dp = BucketHooks(net, size=n, launch=launch, clock=rec.now_us, bucket_mb=BUCKET_MB)
    dp.fn = fn
    losses: list[float] = []
    first: list[torch.Tensor] = []
    for step in range(STEPS):
        with traced_step(ctx, step):
            with rec.span("forward", "forward", "compute", step=step):
                loss = net(mine[:, :-1], mine[:, 1:])
            dp.start()
            begin = rec.now_us()
            loss.backward()
            # backward ends, for the target, when its last gradient arrives (before that hook's launches)
            rec.complete(
                "backward",
                "backward",
                "compute",
                begin,
                dp.last_arrival - begin,
                args={"step": step},
            )
            dp.finish()
            first = first or gradients(net)
            with rec.span("optimizer", "optimizer", "compute", step=step):
                sgd(net)
                dp.zero_grad()
        losses.append(float(loss))
    oracle = one_process()
    pairs = zip(net.parameters(), oracle.model.parameters(), strict=True)
    return {
        "losses": losses,
        "one_process": oracle.losses,
        "param_diff": max(float((p - q).abs().max()) for p, q in pairs),
        "gradient_ratio": gradient_ratio(first, oracle.first),
        "buckets": len(dp.buckets),
        "gradient_bytes": sum(b.buffer.numel() * b.buffer.element_size() for b in dp.buckets),
        "label": settings["label"],
    }


def validate(solution: Any) -> tuple[str | None, str | None]:
    """(the solution's source, None) when it may run on ranks, else (None, what is wrong)."""
    try:
        source = function_source(solution, function="on_gradient", params=("param", "dp"))
    except SolutionError as e:
        return None, str(e)
    wrong = simulated(load(source))  # as the ranks load it: torch and math its only globals
    return (source, None) if wrong is None else (None, wrong)


def simulated(fn: Any) -> str | None:
    """What one simulated backward finds wrong with the hook, said where it was found; None if nothing."""
    wrong = diagnose(simulate(fn), fn)
    return (
        None if wrong is None else f"on one simulated backward, before any process started: {wrong}"
    )


def grade(solution: Any, out: str) -> Result:
    """Validate in this process, run beside the reference on dp = 2 real ranks, hold to one process and the
    overlap."""
    from workbench.config import RunConfig
    from workbench.exercises.grading import grade_function

    return grade_function(
        "buckets",
        solution,
        function="on_gradient",
        params=("param", "dp"),
        simulated=simulated,
        config=RunConfig(dp=DP, global_batch=DP),
        judge=judge,
        out=out,
    )


def run(source: str | None, out: str, label: str) -> Any:
    """The exercise on dp = 2 gloo ranks (`source`: the learner's; None: the reference answer)."""
    from workbench.config import RunConfig
    from workbench.exercises.ranks import run_on_ranks

    return run_on_ranks(
        "buckets",
        config=RunConfig(dp=DP, global_batch=DP),
        solution=source,
        settings={"label": label},
        out=out,
    )


def overlap(run: Any) -> tuple[dict[tuple[int, int], list[float]], dict[tuple[int, int], float]]:
    """From the trace: each (rank, step)'s bucket launch times, and when its backward's last gradient came."""
    ev = run.events
    reduces = ev[(ev.cat == "collective") & ev.label.fillna("").str.startswith("bucket")]
    launches = {
        (int(r), int(s)): sorted(g["start_us"]) for (r, s), g in reduces.groupby(["rank", "step"])
    }
    back = ev[ev.name == "backward"]
    ends = {
        (int(r), int(s)): float(e)
        for r, s, e in zip(back["rank"], back["step"], back["end_us"], strict=True)
    }
    return launches, ends


def judge(yours: Any, reference: Any) -> Result:
    """The real runs against one process (losses, parameters) and the target (each bucket once, overlapped)."""
    from workbench.exercises.ranks import rank_results

    mine = rank_results(yours)
    want = mine[0]["one_process"]
    got = [sum(m["losses"][s] for m in mine) / len(mine) for s in range(STEPS)]
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True))
    drift = max(m["param_diff"] for m in mine)
    same = worst <= LOSS_RTOL and drift <= PARAM_ATOL
    nb = mine[0]["buckets"]
    launches, ends = overlap(yours)
    ev = yours.events
    reduces = ev[(ev.cat == "collective") & ev.label.fillna("").str.startswith("bucket")]
    per_step = reduces.groupby(["rank", "step", "label"]).size()
    once = len(per_step) == len(mine) * STEPS * nb and bool((per_step == 1).all())
    wire = int(reduces.groupby(["rank", "step"])["bytes"].sum().max())
    early = min(sum(t < ends[key] for t in launches.get(key, [])) for key in ends)
    rows = [
        Row(
            what=f"losses vs one process, worst relative difference over {STEPS} steps",
            yours=worst,
            target=f"≤ {LOSS_RTOL:g}",
            ok=worst <= LOSS_RTOL,
        ),
        Row(
            what="parameters after training vs one process, largest difference",
            yours=drift,
            target=f"≤ {PARAM_ATOL:g}",
            ok=drift <= PARAM_ATOL,
        ),
        Row(
            what="gradient at step 0 ÷ one process's",
            yours=mine[0]["gradient_ratio"],
            target=1.0,
            ok=abs(mine[0]["gradient_ratio"] - 1) <= 1e-3,
        ),
        Row(what="every bucket reduced once a step", yours=once, target=True, ok=once),
        Row(
            what="bytes all-reduced per rank and step",
            yours=wire,
            target=mine[0]["gradient_bytes"],
            ok=wire == mine[0]["gradient_bytes"],
            measured=True,
        ),
        Row(
            what="buckets launched before backward's last gradient (fewest in a step)",
            yours=early,
            target=f"{nb - 1} of {nb}",
            ok=early >= nb - 1,
            measured=True,
        ),
    ]
    parts = {"rows": rows, "learner": yours, "reference": reference}
    if not same:
        ratio = mine[0]["gradient_ratio"]
        why = (
            f"At step 0 your ranks stepped with {ratio:.3g} × one process's gradient: dp.all_reduce sums "
            f"the {len(mine)} ranks' gradients, so divide each by dp.size, once and before the launch, for "
            "the step to take their mean."
            if abs(ratio - 1) > 1e-3
            else "The first step's gradient agreed; a later step's did not."
        )
        message = (
            f"your dp = {len(mine)} ranks trained a different model from one process on the whole batch: "
            f"losses {[round(x, 5) for x in got]} against {[round(x, 5) for x in want]}, parameters "
            f"apart by up to {drift:.3g}. {why}"
        )
        return Result(
            exercise="buckets", passed=False, stage="one process", message=message, **parts
        )
    if not once or early < nb - 1:
        message = (
            f"your buckets give the right gradients, but only {early} of the {nb} were launched before "
            "backward's last gradient arrived: their all-reduces waited for the whole backward instead of "
            "running beside it. Launch each bucket as soon as its own last gradient arrives."
            if once
            else "a bucket was reduced more or less than once in a step on the real ranks (see the table)"
        )
        return Result(exercise="buckets", passed=False, stage="target", message=message, **parts)
    message = (
        f"the {len(mine)} ranks train the model one process trains on the whole batch (losses within "
        f"{worst:.1g} relative), each of the {nb} buckets reduced once a step ({wire} bytes, every gradient once) and "
        f"{early} of them launched while backward was still producing gradients"
    )
    return Result(exercise="buckets", passed=True, stage="passed", message=message, **parts)


EXERCISE = Exercise(
    name="buckets",
    title="Bucketed data parallel: launch each bucket's all-reduce as backward fills it",
    you_write="on_gradient(param, dp): note param's arrival in its bucket; launch the bucket once full",
    target="every bucket reduced once a step; all but the last launched before backward's last gradient",
    task=(
        "Write the hook that data parallelism runs as backward produces each gradient. Autograd calls "
        "`on_gradient(param, dp)` once per parameter, as soon as `param.grad` is complete, last layer "
        "first. `dp.bucket_of(param)` is the bucket holding `param`'s gradient: `bucket.index`, "
        "`bucket.params` (its parameters), `bucket.ready` (an empty set at each backward, yours to fill — "
        "with the parameters whose gradients have arrived, say). "
        "`dp.buckets` lists them in the order backward fills them; `dp.size` is the number of ranks. "
        "`dp.all_reduce(bucket)` launches the *sum* of the bucket's gradients over the ranks and returns at "
        "once; the workbench waits for every launch after backward, then takes an SGD step. Each "
        "`param.grad` is a view of its bucket's flat buffer (what the all-reduce sends): change it in "
        "place.\n\n"
        "```python\ndef on_gradient(param, dp):\n    bucket = dp.bucket_of(param)\n    ...\n```\n\n"
        "Rules: every bucket reduced exactly once per backward, after all its gradients have arrived, and "
        "not touched after its launch; the step must use the *mean* of the ranks' gradients. It runs first "
        "on one backward in this process, with dp.size = 3 (a bucket launched twice, too early or never is "
        "named before any process starts), then on 2 gloo ranks for 4 steps of the tiny GPT, beside one "
        "process training on the whole batch. Target, from the trace: every bucket but the last launched "
        "before backward's last gradient arrives — the all-reduces overlap backward."
    ),
    stub=(
        "def on_gradient(param, dp):\n"
        "    bucket = dp.bucket_of(param)\n"
        "    # your code: note param's arrival in its bucket; launch the bucket once it is full\n"
    ),
    grade=grade,
)
