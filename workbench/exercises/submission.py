"""A learner's solution as text: what travels to the ranks (each rank runs it from `solution.py` in the run
directory, so the run keeps what was submitted) and how a rank turns it back into a function.

A function is sent as its own source (`inspect.getsource`: a cell's `def` works, a lambda or a builtin does
not). On the ranks it runs with `torch` and `math` as its globals and whatever its arguments give it — not
the notebook's other names: a helper it calls must be defined inside it."""

from __future__ import annotations

import ast
import importlib
import inspect
import linecache
import textwrap
from collections.abc import Callable
from typing import Any

#: the globals a solution runs with on a rank (and in the in-process checks)
PROVIDED = ("torch", "math")
#: what a NameError from the learner's function means (added to its message, simulated or on a rank)
GLOBALS_HINT = (
    "your function runs with only torch and math as its globals (on the ranks too): define or import what "
    "it uses inside it"
)


class SolutionError(ValueError):
    """A solution that cannot be checked as given: not a function, the wrong arguments, no source."""


def function_source(fn: Any, *, function: str, params: tuple[str, ...]) -> str:
    """`fn`'s source, dedented, ending with `SOLUTION = <its name>`; SolutionError (saying what the exercise
    wants: `def function(params)`, though any name works) if it is not a `def` taking `params`."""
    wanted = f"def {function}({', '.join(params)}): ..."
    if not callable(fn):
        raise SolutionError(
            f"{function}: expected a function like `{wanted}`, got {type(fn).__name__}"
        )
    try:
        names = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = ()
    if len(names) != len(params):
        raise SolutionError(
            f"{function}: your function takes ({', '.join(names)}); the exercise calls it with "
            f"{len(params)} arguments: `{wanted}`"
        )
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise SolutionError(
            f"{function}: the ranks need your function's source and it has none ({e}); define it with "
            f"`def` in a cell: `{wanted}`"
        ) from e
    tree = ast.parse(source)
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if len(tree.body) != 1 or not defs:
        raise SolutionError(
            f"{function}: give a function defined with `def` (`{wanted}`), not a lambda"
        )
    return f"{source}\n\nSOLUTION = {defs[0].name}\n"


def load(source: str, filename: str = "<your solution>") -> Callable:
    """The function in `source` (as `function_source` wrote it), run with PROVIDED as its globals.
    `filename` is what tracebacks name (the run's solution.py: its lines are shown); the source is put in
    linecache under it, so that a traceback shows the learner's lines in this process too."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {name: importlib.import_module(name) for name in PROVIDED}
    namespace["__name__"] = "solution"
    exec(compile(source, filename, "exec"), namespace)
    return namespace["SOLUTION"]


def not_defined(e: BaseException) -> str:
    """What `load` raised (running the `def`: a default argument or a decorator naming what is not there), in
    a learner's words."""
    said = f"your function cannot be defined as the ranks define it: {type(e).__name__}: {e}"
    return f"{said}. {GLOBALS_HINT}" if isinstance(e, NameError) else said
