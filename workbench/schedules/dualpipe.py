"""DualPipe and DualPipeV (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.2.1; the V by Sea AI Lab's
"cut-in-half", deepseek-ai/DualPipe): bidirectional pipelines whose steady state issues one microbatch's
forward together with another's backward (an F&B pair, actions.py), so that on a GPU each hides the
other's communication, and whose tail splits backwards into I and W as the zero-bubble schedules do.

**DualPipeV** (p ranks, 2p stages in a V: rank r holds stages r and 2p − 1 − r, m ≥ 2p microbatches).
Each rank runs eight phases; "phase 0" is its stage on the way down (r), "phase 1" the one on the way up
(2p − 1 − r), each phase taking its microbatches in order:

    1  2(p − r − 1) forwards of phase 0                          the warm-up, deepest for rank 0
    2  r + 1 times: a forward of phase 0, a forward of phase 1
    3  p − r − 1 times: I of phase 1, the oldest pending W, a forward of phase 1
    4  m − 2p + r + 1 times: F&B (forward of phase 0, backward of phase 1), F&B (forward of phase 1,
       backward of phase 0) — the steady state; the last rank runs its very first pair as two actions
    5  p − r − 1 times: a backward of phase 1, F&B (forward of phase 1, backward of phase 0)
    6  r + 1 times: a backward of phase 1, a backward of phase 0 — from the middle of this phase on,
       each backward is an I, its W left for a bubble
    7  p − r − 1 times: the oldest pending W, an I of phase 0
    8  the remaining Ws

Published costs (the DualPipe README; F, B, W: one stage's forward, full backward and weight pass, F&B:
a pair): bubble (PP/2 − 1)(F&B + B − 3W) over PP = 2p stages; per rank 2 stages of parameters and
PP + 1 stages' microbatches of activations.

**DualPipe** (p ranks, p even, m even with m/2 ≥ p; `placement="dual"`). Two copies of the model in two
pipelines of p stages: the first m/2 microbatches go down the ranks, the rest up them, and rank r holds
part r of one copy and part p − 1 − r of the other. Folded at its middle it is a DualPipeV over p/2
ranks: rank r runs what DualPipeV's rank min(r, p − 1 − r) runs with m/2 microbatches, its phase 0
being the pipeline that enters at its end of the row (the first half of the ranks: the one going down)
— the only difference is that where a V turns on one rank, DualPipe's two middle ranks send to each
other. Each copy's gradients are summed with the other's after backward (parallel/twin_grads.py), so
both take the same update. Costs: the same bubble, 2× the parameters per rank of a p-stage pipeline,
p + 1 stages' microbatches of activations.
"""

from __future__ import annotations

from collections import deque

from workbench.schedules.actions import Compute, Step


def dualpipev_orders(p: int, m: int) -> list[list[Step]]:
    """Each rank's compute order for DualPipeV over p ranks (2p stages in a V) and m microbatches."""
    if p < 2 or m < 2 * p:
        raise ValueError(
            f"dualpipev needs pp ≥ 2 and microbatches ≥ 2·pp (one per stage): pp={p}, microbatches={m}"
        )
    return [_rank_order(p, m, r, stages=(r, 2 * p - 1 - r), first_mb=(0, 0)) for r in range(p)]


def dualpipe_orders(p: int, m: int) -> list[list[Step]]:
    """Each rank's compute order for DualPipe over p ranks (stages: actions.py's "dual" placement) and m
    microbatches, the first m/2 entering at rank 0 and the rest at rank p − 1."""
    if p < 2 or p % 2 or m % 2 or m < 2 * p:
        raise ValueError(
            f"dualpipe needs an even pp ≥ 2 and an even number of microbatches ≥ 2·pp (half enter at "
            f"each end, at least one per stage): pp={p}, microbatches={m}"
        )
    half, orders = p // 2, []
    for r in range(p):
        down, up = r, 2 * p - 1 - r  # this rank's stage in the pipeline going down, and going up
        if r < half:  # the pipeline going down enters at this end of the row
            order = _rank_order(half, m // 2, r, stages=(down, up), first_mb=(0, m // 2))
        else:
            order = _rank_order(half, m // 2, p - 1 - r, stages=(up, down), first_mb=(m // 2, 0))
        orders.append(order)
    return orders


def _rank_order(
    n: int, m: int, r: int, *, stages: tuple[int, int], first_mb: tuple[int, int]
) -> list[Step]:
    """The eight phases (module docstring) of rank r of a DualPipeV over n ranks and m microbatches;
    `stages`: the rank's stage of phase 0 and of phase 1, `first_mb`: the microbatch number each phase
    starts from (DualPipe numbers the second pipeline's microbatches after the first's)."""
    order: list[Step] = []
    next_f, next_b = [0, 0], [0, 0]
    pending_w: deque[tuple[int, int]] = deque()

    def f(phase: int) -> Compute:
        next_f[phase] += 1
        return ("F", stages[phase], first_mb[phase] + next_f[phase] - 1)

    def b(phase: int, split: bool = False) -> Compute:
        next_b[phase] += 1
        mb = first_mb[phase] + next_b[phase] - 1
        if split:
            pending_w.append((stages[phase], mb))
        return ("I" if split else "B", stages[phase], mb)

    def w() -> None:
        if pending_w:
            stage, mb = pending_w.popleft()
            order.append(("W", stage, mb))

    order += [f(0) for _ in range(2 * (n - r - 1))]  # 1
    for _ in range(r + 1):  # 2
        order += [f(0), f(1)]
    for _ in range(n - r - 1):  # 3
        order.append(b(1, split=True))
        w()
        order.append(f(1))
    for i in range(m - 2 * n + r + 1):  # 4
        if (
            i == 0 and r == n - 1
        ):  # the turn: not paired, which shortens the bubble (DeepSeek's note)
            order += [f(0), b(1)]
        else:
            order.append((f(0), b(1)))
        order.append((f(1), b(0)))
    for _ in range(n - r - 1):  # 5
        order += [b(1), (f(1), b(0))]
    split = False
    for i in range(r + 1):  # 6
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        order.append(b(1, split))
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        order.append(b(0, split))
    for _ in range(n - r - 1):  # 7
        w()
        order.append(b(0, split))
    while pending_w:  # 8: r + 1 of them
        w()
    return order
