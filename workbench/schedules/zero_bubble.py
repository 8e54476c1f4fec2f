"""Zero-bubble schedules (Qi, Wan, Huang and Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024): the
backward split into I (the input's gradient, which the previous stage waits for) and W (the weights'
gradients, which nobody waits for), and W moved into the time a rank would otherwise sit idle.

Both are generated here from the paper's rules for its handcrafted ones: every rank runs, in unit time
(T_F = T_I = T_W), the first of

    F   the next forward whose input has arrived, if the memory limits allow one more in flight
    I   the oldest backward whose output gradient has arrived (in a V, the later stage's first)
    W   the oldest pending weight gradient: W runs only where the rank would otherwise sit idle

and the order each rank ran its actions in is the schedule (an I followed at once by its W becomes one
B; transfers are then placed by placement._lockstep, as for every schedule). The memory limits are the paper's:

- **zbh1** (§2.1, ZB-H1): p stages in a loop, the activations of 1F1B (stage s holds at most p − s
  microbatches between F and I) and every stage at most p microbatches between F and W, which delays
  the W passes of later stages by their warm-up. Bubble (p − 1)(T_F + T_I − T_W): a third of 1F1B's at
  equal costs, (p − 1)/3m of the work.
- **zbv** (§6, ZB-V): 2p stages in a V (rank r holds stages r and 2p − 1 − r), each rank at most 2p
  chunk-microbatches between F and I — the activations of 1F1B, since a chunk is half a stage — and 3p
  between F and W (the weight-gradient stash, smaller than an activation). Bubble 0 at equal costs
  once m ≥ 2p (checked for p = 2, 4, 8 in tests/test_zero_bubble.py): the start-up stagger is the only
  idle time left, the "parallelogram" that a step without an optimizer synchronisation would overlap
  with the next.

The bubble rate that these numbers are in is `Timeline.bubble_rate()` (simulator.py).
"""

from __future__ import annotations

Order = list[tuple[str, int, int]]  # (kind, stage, microbatch) of one rank's compute actions


def zero_bubble_orders(name: str, p: int, m: int) -> tuple[list[Order], str, int]:
    """(per-rank compute orders, placement, v) of schedule `name` ("zbh1" or "zbv")."""
    if name == "zbh1":
        stages = {r: [r] for r in range(p)}
        act_cap = {r: p - r for r in range(p)}
        w_cap = {r: p for r in range(p)}
        orders = _greedy(p, m, n_stages=p, stages=stages, act_cap=act_cap, w_cap=w_cap)
        return merge_adjacent(orders), "loop", 1
    if name == "zbv":
        stages = {r: [r, 2 * p - 1 - r] for r in range(p)}
        orders = _greedy(
            p,
            m,
            n_stages=2 * p,
            stages=stages,
            act_cap=dict.fromkeys(range(p), 2 * p),
            w_cap=dict.fromkeys(range(p), 3 * p),
        )
        return merge_adjacent(orders), "v", 2
    raise ValueError(f"unknown zero-bubble schedule {name!r}; valid: zbh1, zbv")


def merge_adjacent(orders: list[Order]) -> list[Order]:
    """An I followed at once by its own W is one B (what torch's `_merge_bw` does to its schedules): the
    same work in one autograd pass, and nothing stashed between the two."""
    out = []
    for order in orders:
        merged: Order = []
        for kind, stage, mb in order:
            if kind == "W" and merged and merged[-1] == ("I", stage, mb):
                merged[-1] = ("B", stage, mb)
            else:
                merged.append((kind, stage, mb))
        out.append(merged)
    return out


def _greedy(
    p: int,
    m: int,
    *,
    n_stages: int,
    stages: dict[int, list[int]],
    act_cap: dict[int, int],
    w_cap: dict[int, int],
) -> list[Order]:
    """Unit-time list scheduling: each time step, every rank runs its first ready action of F, I, W
    (module docstring); a result of an action is usable from the next time step on."""
    last = n_stages - 1
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, mb) → the time step it ran in
    next_f = {s: 0 for s in range(n_stages)}
    next_i = {s: 0 for s in range(n_stages)}
    pending_w: dict[int, list[tuple[int, int]]] = {r: [] for r in range(p)}
    orders: list[Order] = [[] for _ in range(p)]
    total = 3 * m * n_stages
    t = 0
    while sum(len(o) for o in orders) < total:
        ran = []
        for r in range(p):
            act = _pick(
                r,
                t,
                m=m,
                last=last,
                mine=stages[r],
                done=done,
                next_f=next_f,
                next_i=next_i,
                pending_w=pending_w[r],
                act_cap=act_cap[r],
                w_cap=w_cap[r],
            )
            if act is not None:
                ran.append((r, act))
        for r, (kind, stage, mb) in ran:
            done[(kind, stage, mb)] = t
            orders[r].append((kind, stage, mb))
            if kind == "F":
                next_f[stage] += 1
            elif kind == "I":
                next_i[stage] += 1
                pending_w[r].append((stage, mb))
            else:
                pending_w[r].remove((stage, mb))
        t += 1
        if t > 4 * total:
            raise ValueError(f"no zero-bubble schedule found for p={p}, m={m}")
    return orders


def _pick(
    r: int,
    t: int,
    *,
    m: int,
    last: int,
    mine: list[int],
    done: dict[tuple[str, int, int], int],
    next_f: dict[int, int],
    next_i: dict[int, int],
    pending_w: list[tuple[int, int]],
    act_cap: int,
    w_cap: int,
) -> tuple[str, int, int] | None:
    def ready(key: tuple[str, int, int]) -> bool:
        return done.get(key, t) < t

    backwards = []
    for s in mine:  # I: its forward done here, and the next stage's I (or the loss) done
        mb = next_i[s]
        if mb < m and ready(("F", s, mb)) and (s == last or ready(("I", s + 1, mb))):
            backwards.append((mb, -s))
    activations = sum(next_f[s] - next_i[s] for s in mine)
    until_w = activations + len(pending_w)
    forwards = []
    if activations < act_cap and until_w < w_cap:
        forwards = [
            (next_f[s], -s)
            for s in mine
            if next_f[s] < m and (s == 0 or ready(("F", s - 1, next_f[s])))
        ]
    for kind, cands in (("F", forwards), ("I", backwards)):
        if cands:
            mb, s = min(cands)
            return (kind, -s, mb)
    if pending_w:
        s, mb = pending_w[0]
        return ("W", s, mb)
    return None
