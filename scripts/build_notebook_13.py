"""Regenerates notebooks/13_exercises.ipynb (outputs stripped). Edit here, then run it.

Each exercise's empty cell is its stub from the package (workbench.exercises: one source for the task and the
cell), tagged `exercise:<name>`: the notebook's test fills it with the reference answer
(scripts/exercise_answers.py); the notebook as shipped keeps it empty."""

import nbformat as nbf
from notebook_cells import code, md, write

from workbench.exercises import EXERCISES

#: (exercise, the name its cell defines, the lesson that teaches it, what it asks in a sentence or two)
SECTIONS = (
    (
        "ring",
        "ring_all_reduce",
        "09_communication.ipynb",
        "The collective under data parallelism. Every rank sends to its right-hand neighbour and receives "
        "from its left, 2(n−1) times; the chunk each step carries is the whole exercise.",
    ),
    (
        "buckets",
        "on_gradient",
        "01_data_parallel.ipynb",
        "Data parallelism hides its all-reduce behind backward by launching each bucket as soon as its last "
        "gradient exists. You write the hook that decides when.",
    ),
    (
        "zero1",
        "zero1_step",
        "04_zero.ipynb",
        "ZeRO-1 keeps 1/n of the optimizer state on each rank: reduce-scatter the gradients, update your shard, "
        "all-gather the parameters — and sends no more bytes than plain data parallelism.",
    ),
    (
        "tensor-parallel",
        "tp_mlp",
        "02_tensor_parallel.ipynb",
        "Megatron's MLP: the first matmul split by its output features, the second by its input features, one "
        "all-reduce in forward (g) and one in backward (f). You place them.",
    ),
    (
        "pipeline",
        "one_f_one_b",
        "03_pipeline_parallel.ipynb",
        "1F1B for four stages and eight microbatches, written as data: each rank's forwards and backwards in "
        "order. Any table you write is validated, trained for real and held to 1F1B's bubble and memory.",
    ),
    (
        "checkpoint-interval",
        "checkpoint_interval",
        "08_fault_tolerance.ipynb",
        "How often to save: often enough that a failure loses little, rarely enough that saving costs "
        "little. The check measures a real checkpoint's cost and holds your interval to the least waste.",
    ),
)


def exercise_cell(name: str):
    cell = nbf.v4.new_code_cell(EXERCISES[name].stub.strip())
    cell.metadata["tags"] = [f"exercise:{name}"]
    return cell


cells = [
    md("""
# 13 · Exercises

Reading about a ring all-reduce is not the same as writing one. Here you write six mechanisms of distributed
training yourself, and the workbench grades each one the way the engine is tested:

1. **validate** — before any process starts: the signature, the shapes, and where it can be decided without
   processes, the schedule rule and deadlock freedom (a deadlock is named by rank and step);
2. **run** — on real ranks (gloo processes on this machine), traced like training;
3. **one process** — the result compared with what one process computes (the sum, the losses, the gradients);
4. **target** — held to what the mechanism is for, measured: bytes on the wire, overlap, memory, bubble, waste.

A wrong answer gets a message that says what went wrong and where; a right one shows its timeline beside the
reference's. The reference answers live inside the package and are never printed here. Each exercise names the
lesson that teaches it: open that notebook first if a task is new to you.

**How to work.** Read the task (`ex.show(...)`), fill in the cell below it, run the check. Run the check before
you write anything to see what it says about an empty answer. Your function runs from its own text — in this
notebook's simulated ranks and on the real ones alike — with only `torch` and `math` as its names: a helper it
calls must be defined (or imported) inside it.
"""),
    code("""
import math
import os
import torch
import workbench as wb
from workbench import viz

ex = wb.exercises
OUT = os.path.join("..", "traces", "nb13")
ex.table().style.hide(axis="index")  # each exercise: what you write, what it is held to
"""),
]
#: the ring's prediction: asked before its check, revealed from the bytes the check measures
RING_PREDICTION = (
    code("""
guess = viz.predict("Before you check it: how many bytes will each rank of your ring send, all-reducing "
                    "this 8192-byte buffer over 4 ranks?", unit=" bytes")
guess
"""),
    code("""
ring = ex.check("ring", ring_all_reduce, out=os.path.join(OUT, "ring"))
ring
"""),
    code("""
if ring.learner is not None:  # your ring reached the real ranks: its bytes, from the trace
    guess.reveal(ring.row("bytes a rank sent").yours,
                 "2(n−1)/n·S: n−1 chunks of S/n to reduce-scatter, n−1 to gather — 1.5 × the buffer at n = 4")
else:
    print("your ring stopped before the real ranks (above): fix it, run its check, then this cell")
"""),
)


def plain_cell(text: str):
    """A code cell built from a template (the exercise's name filled in): it holds no claim."""
    return nbf.v4.new_code_cell(text)


for number, (name, function, lesson, lead) in enumerate(SECTIONS, start=1):
    cells += [
        md(f"## {number} · {EXERCISES[name].title}\n\n{lead} (Taught in [{lesson}]({lesson}).)"),
        plain_cell(f'ex.show("{name}")'),
        exercise_cell(name),
    ]
    if name == "ring":
        cells += RING_PREDICTION
    else:
        cells.append(plain_cell(f'ex.check("{name}", {function}, out=os.path.join(OUT, "{name}"))'))
cells.append(
    md("""
## Where next

A schedule is data: write a table other than 1F1B — GPipe, an order you invent, another p or m — and give it to
`ex.try_schedule(table)`: it validates it, trains it on real ranks beside 1F1B and one process, and shows its
activations in flight and its bubble beside 1F1B's.
""")
)
write(cells, "13_exercises.ipynb")
