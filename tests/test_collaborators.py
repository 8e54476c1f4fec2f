"""The communicator communicates (issue 50): the recorder, the memory tracker, the process groups, the
device clock and the emulated network it is built with are its own collaborators, handed to it at
construction. Whoever else needs one is handed it too, by keyword — nobody outside workbench/comm/
reaches one through a Communicator (`ctx.comm.groups`, `self.comm.recorder`, `pp_comm.memory` ...).
Read from the source with `ast`, so nothing is imported or run."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "workbench"
#: what a Communicator is built with, and keeps to itself
COLLABORATORS = {"recorder", "memory", "groups", "clock", "network"}


def _is_communicator(node: ast.expr) -> bool:
    """A name or attribute that holds a Communicator: `comm`, `x.comm`, `pp_comm`, `self.ep_comm`."""
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    else:
        return False
    return name == "comm" or name.endswith("_comm")


def reached_through_comm(source: str, where: str = "<snippet>") -> list[str]:
    """Every place in `source` that reads (or sets) a collaborator on a Communicator, by attribute or by
    `getattr` / `setattr` with a literal name."""
    found: list[str] = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Attribute) and node.attr in COLLABORATORS:
            if _is_communicator(node.value):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and _is_communicator(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in COLLABORATORS
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_collaborator_is_reached_through_the_communicator():
    found = [
        hit
        for path in sorted(ROOT.rglob("*.py"))
        if ROOT / "comm" not in path.parents
        for hit in reached_through_comm(path.read_text(), str(path.relative_to(ROOT.parent)))
    ]
    assert found == [], "collaborators reached through a Communicator:\n" + "\n".join(found)


#: the ways code reached the recorder, the memory tracker, the groups, the clock and the network before
REACHED = {
    "the context's communicator": "index = ctx.comm.groups.index('pp')",
    "a class's own communicator": """
        class Zero3:
            def gather(self):
                self.comm.memory.allocate("temporary", 4)
    """,
    "a pipeline communicator": "pp_comm.recorder.span('send')",
    "a bare name": "if comm.network is not None: pass",
    "wiring after construction": "ctx.comm.clock = clock",
    "through getattr": "clock = getattr(comm, 'clock', None)",
}


@pytest.mark.parametrize("snippet", REACHED.values(), ids=REACHED.keys())
def test_the_scan_finds_a_collaborator_reached_through_the_communicator(snippet):
    assert reached_through_comm(snippet), "the scan must fail on this"


def test_the_scan_leaves_the_communicator_s_own_work_alone():
    """Not vacuous the other way: collectives, counters, a context's own recorder and groups pass."""
    fine = """
        ctx.comm.all_reduce(t, "dp", label="grad")
        ctx.comm.end_step()
        step = comm.step
        n = comm.size("dp")
        ctx.recorder.span("forward")
        ctx.groups.index("pp")
        self.memory.allocate("temporary", 4)
    """
    assert reached_through_comm(fine) == []
