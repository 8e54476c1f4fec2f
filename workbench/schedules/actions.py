"""A pipeline schedule as data (the shape of torch.distributed.pipelining and DeepSpeed's pipe schedules):
per rank, a list of actions, which the validator checks, the simulator replays, the charts draw and the
executor runs.

Stages: the model is cut into S = p·v stages. With `placement="loop"` stage k lives on rank k mod p as
its chunk k // p (Megatron-LM's interleaving; v = 1 is the usual one stage per rank); with
`placement="v"` (v = 2, ZBV and DualPipeV) rank r holds stages r and 2p − 1 − r, so the model runs down
the ranks and back up, and stage 0 and the loss both live on rank 0. With `placement="dual"` (v = 2,
DeepSeek-V3's DualPipe) there are two pipelines of p stages each, over two copies of the model: stages
0 … p − 1 run down the ranks (the model's part k on rank k) and carry the first m/2 microbatches,
stages p … 2p − 1 run up them (part k on rank p − 1 − k, stage p + k) and carry the rest; rank r holds
stages r and 2p − 1 − r, as in a V, but nothing flows from stage p − 1 to stage p. An action is

    F  / B               forward / backward of `microbatch` on `stage`
    I  / W               the backward split in two (Qi et al. 2024, zero bubble): I computes the gradient
                         of the stage's input (what the previous stage waits for), W the gradients of the
                         weights (what nobody waits for, so a schedule may run it later, in a bubble);
                         B = I followed at once by W
    SEND_F / RECV_F      the activation from `stage` to `peer` (= stage + 1)
    SEND_B / RECV_B      the gradient from `stage` to `peer` (= stage − 1)

written as torch pipelining does: "2F5" is stage 2's forward of microbatch 5. Two stages on one rank
(stage p − 1 to p in a V) hand their tensors over in memory: no transfer is listed.

**F&B** (DualPipe, DeepSeek-V3 §3.2.1): an F and a B of two different microbatches issued together, as
one step of the rank (`Action.pair`, the same number on both): what one needs and what the other needs
is received before the pair, what both produce is sent after it. On a GPU the two computations overlap
each other's communication (an expert-parallel all-to-all, a send); a single CPU thread runs them one
after the other, as torch's runtime does without a custom overlap function. In torch's CSV a pair is
`(0F3;3B1)OVERLAP_F_B`.

**Posting.** The transfers of one lockstep round (`Action.batch`, schedule.py) are posted together, as
one `P2PBatch` (one `torch.distributed.batch_isend_irecv`, one NCCL group); the rank waits for a batch
only when a compute action needs what it receives. That is what makes 1F1B safe on NCCL: a rank's
"send F1" and "receive B0" are one batch, its neighbour's "send B0" and "receive F1" another, and each
batch's sends meet the other's receives. Posted one by one, the two sends would each wait for a receive
queued behind the other (`Schedule.program(rank, batched=False)` gives that posting, so the validator
can show it deadlock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

COMPUTE = ("F", "B", "I", "W")
# what needs the gradient of the stage's output, and sends the input's gradient back
BACKWARD = ("B", "I")
KINDS = ("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B")
PLACEMENTS = ("loop", "v", "dual")

# a transfer as both its sides name it: (F or B, from stage, to stage, microbatch)
Transfer = tuple[str, int, int, int]
# (kind, stage, microbatch) of a compute action; a rank's order is a list of them, or of F&B pairs
Compute = tuple[str, int, int]
Step = Compute | tuple[Compute, Compute]


def flatten(order: Sequence[Step]) -> list[Compute]:
    """A rank's compute order with its F&B pairs written as their two actions, F first."""
    out: list[Compute] = []
    for step in order:
        out.extend(step if isinstance(step[0], tuple) else [step])
    return out


@dataclass(frozen=True, kw_only=True)
class Action:
    kind: str
    stage: int
    microbatch: int
    peer: int | None = None  # the other stage of a send or receive
    # transfers: the round they are posted in (one P2PBatch per round and rank)
    batch: int | None = None
    # an F and a B issued together (F&B: module docstring): the same number on both, per rank
    pair: int | None = None

    def __str__(self) -> str:
        if self.kind in COMPUTE:
            return f"{self.stage}{self.kind}{self.microbatch}"
        return (
            f"{self.kind} {self.stage}→{self.peer} mb{self.microbatch}"
            if self.kind.startswith("SEND")
            else f"{self.kind} {self.peer}→{self.stage} mb{self.microbatch}"
        )

    @property
    def is_send(self) -> bool:
        return self.kind.startswith("SEND")

    @property
    def is_recv(self) -> bool:
        return self.kind.startswith("RECV")

    @property
    def peer_stage(self) -> int:
        """The other stage of a send or receive (a compute action has none)."""
        if self.peer is None:
            raise ValueError(f"{self.kind} of stage {self.stage} names no peer: it is no transfer")
        return self.peer

    def transfer(self) -> Transfer:
        """The transfer a send or receive takes part in: (F or B, from stage, to stage, microbatch) — the
        same on both sides."""
        src, dst = (self.stage, self.peer_stage) if self.is_send else (self.peer_stage, self.stage)
        return (self.kind[-1], src, dst, self.microbatch)


@dataclass(frozen=True)
class P2PBatch:
    """Transfers posted together (one batch_isend_irecv, one NCCL group): they finish together."""

    actions: tuple[Action, ...]
    kind = "P2P"

    def __str__(self) -> str:
        return " + ".join(str(a) for a in self.actions)


Item = Action | P2PBatch


@dataclass(kw_only=True)
class Schedule:
    name: str
    p: int
    m: int
    v: int
    actions: list[list[Action]] = field(default_factory=list)  # per rank
    placement: str = "loop"  # which rank holds which stage (module docstring)

    @property
    def stages(self) -> int:
        return self.p * self.v

    def rank_of(self, stage: int) -> int:
        if self.placement in ("v", "dual"):
            return stage if stage < self.p else 2 * self.p - 1 - stage
        return stage % self.p

    def next_stage(self, stage: int) -> int | None:
        """The stage that stage's output feeds (None: it computes the loss)."""
        nxt = stage + 1
        if nxt >= self.stages or (self.placement == "dual" and nxt == self.p):
            return None
        return nxt

    def prev_stage(self, stage: int) -> int | None:
        """The stage that feeds stage's input (None: it starts from the tokens)."""
        if stage == 0 or (self.placement == "dual" and stage == self.p):
            return None
        return stage - 1

    def carries(self, stage: int, microbatch: int) -> bool:
        """Whether the microbatch passes through the stage: always, but in DualPipe, where the first
        m/2 microbatches take the pipeline down the ranks (stages < p) and the rest the one up them."""
        if self.placement != "dual":
            return True
        return (stage < self.p) == (microbatch < self.m // 2)

    def model_part(self, stage: int) -> tuple[int, int]:
        """(which part, of how many): the slice of the model's layers the stage holds. DualPipe's two
        pipelines each cut the model in p parts (stage k and stage p + k hold copies of part k)."""
        if self.placement == "dual":
            return stage % self.p, self.p
        return stage, self.stages

    def twin(self, stage: int) -> int | None:
        """DualPipe: the stage holding the other copy of this stage's part (None elsewhere)."""
        if self.placement != "dual":
            return None
        return (stage + self.p) % (2 * self.p)

    def chunk_of(self, stage: int) -> int:
        return stage // self.p

    def local(self, a: int, b: int) -> bool:
        """Stages a and b live on one rank: their tensors are handed over, not sent."""
        return self.rank_of(a) == self.rank_of(b)

    def program(self, rank: int, batched: bool = True) -> list[Item]:
        """What the rank executes, in order: each compute action alone, and the transfers of each round
        (`Action.batch`) as one P2PBatch (batched=False: every transfer a batch of its own, the
        per-operation posting NCCL can deadlock on)."""
        out: list[Item] = []
        run: list[Action] = []
        for a in self.actions[rank]:
            if run and (a.kind in COMPUTE or not batched or a.batch != run[-1].batch):
                out.append(P2PBatch(tuple(run)))
                run = []
            if a.kind in COMPUTE:
                out.append(a)
            else:
                run.append(a)
        if run:
            out.append(P2PBatch(tuple(run)))
        return out

    def forward_only(self) -> Schedule:
        """The same schedule without its backwards: each rank's F actions and the transfers of activations,
        in their order, F&B pairs undone (the validation loss's forward pass: pipeline/executor.py's
        `evaluate`). Removing the backwards' transfers from each batch keeps every rank's batches in
        the same order on both sides of a pair of ranks; in a V and in DualPipe activations cross a pair
        of ranks both ways, so freedom from deadlock is not inherited by argument: tests/test_dualpipe.py
        simulates every schedule's forward-only program under NCCL's rule."""
        keep = ("F", "SEND_F", "RECV_F")
        return Schedule(
            name=f"{self.name} (forward only)",
            p=self.p,
            m=self.m,
            v=self.v,
            actions=[
                [replace(a, pair=None) for a in acts if a.kind in keep] for acts in self.actions
            ],
            placement=self.placement,
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "p": self.p,
            "m": self.m,
            "v": self.v,
            "placement": self.placement,
            "actions": [[{**asdict(a), "label": str(a)} for a in rank] for rank in self.actions],
            "program": [[str(item) for item in self.program(r)] for r in range(self.p)],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        acts = [
            [
                Action(
                    kind=a["kind"],
                    stage=a["stage"],
                    microbatch=a["microbatch"],
                    peer=a.get("peer"),
                    batch=a.get("batch"),
                    pair=a.get("pair"),
                )
                for a in rank
            ]
            for rank in d["actions"]
        ]
        return cls(
            name=d["name"],
            p=d["p"],
            m=d["m"],
            v=d["v"],
            actions=acts,
            placement=d.get("placement", "loop"),
        )

    def grid(self) -> str:
        """The compute actions as text, one line per rank (torch pipelining's printout; an F&B pair as
        `(0F3;3B1)`)."""
        return "\n".join(
            f"rank {r}: " + " ".join(compute_cells(acts)) for r, acts in enumerate(self.actions)
        )


def compute_cells(acts: list[Action]) -> list[str]:
    """A rank's compute actions as torch writes them: "2F5", and an F&B pair as "(2F5;5B1)"."""
    cells: list[str] = []
    pairs: dict[int, int] = {}  # pair number → its cell
    for a in acts:
        if a.kind not in COMPUTE:
            continue
        if a.pair is not None and a.pair in pairs:
            i = pairs[a.pair]
            cells[i] = f"({cells[i]};{a})"
            continue
        if a.pair is not None:
            pairs[a.pair] = len(cells)
        cells.append(str(a))
    return cells


def peak_in_flight(s: Schedule) -> list[int]:
    """Per rank, the most (stage, microbatch) forwards whose backward (B or I) has not run yet: the
    activations the schedule makes a rank hold at once (in chunks: a V's chunk is half a 1F1B stage)."""
    return _peak(s, ("F",), BACKWARD)


def peak_pending_w(s: Schedule) -> list[int]:
    """Per rank, the most (stage, microbatch) whose I has run and W not yet: the weight-gradient stash
    (each Linear's input and output gradient) the schedule makes a rank hold at once."""
    return _peak(s, ("I",), ("W",))


def _peak(s: Schedule, up: tuple[str, ...], down: tuple[str, ...]) -> list[int]:
    out = []
    for acts in s.actions:
        live = peak = 0
        for a in acts:
            live += (a.kind in up) - (a.kind in down)
            peak = max(peak, live)
        out.append(peak)
    return out
