"""The shape of the code, as docs/architecture.md states it: small files and functions, layers that
import one way, no import cycle. Read from the source with `ast`, so nothing is imported or run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "workbench"
#: where to look, not a target: a file over 500 lines or a function over 120 (counted as formatted) is read again
#: (docs/architecture.md) — split where it holds two ideas, else listed in LOOKED_AT with why it is one
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 120
#: what was looked at past those lines and kept whole: "path" or "path:function" → why it is one idea
LOOKED_AT: dict[str, str] = {
    "comm/traced.py": "one class, the Communicator: each collective a short method that checks, launches and "
    "records itself the same way; cutting the collectives across files would scatter one class's methods",
}
#: the packages in the order data flows through them, lowest first: a package imports only from its own layer
#: and the ones before it (anywhere in a file: at the top, inside a function, under TYPE_CHECKING)
LAYERS = (
    ("config", "schedules"),  # what a run is, as data (no torch)
    ("trace",),  # the record format, written and read (no torch)
    ("predict",),  # the cost model: formulas, estimator, planner (no torch)
    ("comm", "measure"),  # torch.distributed, traced; what a rank measures of itself
    ("model", "data"),  # what is trained, on which tokens
    ("parallel", "pipeline"),  # the strategies
    ("optim",),  # the updaters
    ("engine",),  # one rank's training: context, parallelize, the step, checkpoints, loggers
    ("analysis",),  # summary.json and the run reader, from the files (no torch)
    ("viz",),  # the charts
    ("launching",),  # starting runs and following them (its worker runs the engine in each rank)
    ("studies",),  # what launches runs to measure or calibrate
    ("exercises",),  # graded exercises: the learner's code run on ranks beside the reference
    ("cli",),  # the command
)
LAYER = {f"workbench.{pkg}": i for i, pkgs in enumerate(LAYERS) for pkg in pkgs}
#: the prediction package: never imported by what trains
PREDICT = "workbench.predict"
TRAINS = (
    "workbench.comm",
    "workbench.measure",
    "workbench.model",
    "workbench.data",
    "workbench.parallel",
    "workbench.pipeline",
    "workbench.optim",
    "workbench.engine",
)


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYER.get(".".join(parts[:2])) if len(parts) > 1 else None


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The import nodes under `if TYPE_CHECKING:`: for annotations only, never run."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def _imports(path: Path, modules: dict[str, Path], run_time_only: bool = False) -> set[str]:
    """workbench modules imported anywhere in the file (also inside functions and, unless `run_time_only`,
    under TYPE_CHECKING)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree) if run_time_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from workbench import run` imports the submodule, not the package's facade
            names = [node.module] * (node.module != "workbench") + [
                f"{node.module}.{a.name}" for a in node.names
            ]
        else:
            continue
        found |= {n for n in names if n in modules and n.startswith("workbench")}
    return found


def _past_the_lines() -> dict[str, int]:
    """Each file past MAX_FILE_LINES ("path") and function past MAX_FUNCTION_LINES ("path:function"): its
    lines."""
    found = {}
    for path in ROOT.rglob("*.py"):
        name = str(path.relative_to(ROOT))
        lines = path.read_text().count("\n")
        if lines > MAX_FILE_LINES:
            found[name] = lines
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found[f"{name}:{node.name}"] = n
    return found


def test_files_and_functions_past_the_lines_were_looked_at():
    """Sizes say where to look, not what to reach (docs/architecture.md): a file or function past the lines
    fails here until someone has read it — and split it where it holds two ideas, or listed it in LOOKED_AT
    with why it is one (a clear 130-line function beats three fragments and a lambda). An entry no longer
    past the lines fails too, so the list says what is true."""
    found = _past_the_lines()
    unread = {k: n for k, n in found.items() if k not in LOOKED_AT}
    assert not unread, (
        f"past {MAX_FILE_LINES} lines a file / {MAX_FUNCTION_LINES} a function, not looked at: {unread}: "
        "split what holds two ideas, or add it to LOOKED_AT with why it is one"
    )
    stale = sorted(set(LOOKED_AT) - set(found))
    assert not stale, f"LOOKED_AT lists what is no longer past the lines: {stale}"


def test_every_package_has_its_layer():
    packages = {
        f"workbench.{p.name}" for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"
    }
    assert packages == set(LAYER), (
        f"packages without a layer: {packages - set(LAYER)}; gone: {set(LAYER) - packages}"
    )
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside every package: {loose}"


def test_no_import_climbs_a_layer():
    """Data flows one way — config → grid → parallelize → train_step → trace files → analysis → charts: no
    package imports one above it, at the top of a file or inside a function."""
    modules = _modules()
    climbs = [
        f"{name} imports {imp}"
        for name, path in modules.items()
        for imp in _imports(path, modules)
        if layer_of(name) is not None
        and layer_of(imp) is not None
        and layer_of(imp) > layer_of(name)
    ]
    assert not climbs, climbs


def test_nothing_that_trains_imports_the_predictions():
    modules = _modules()
    bad = [
        f"{name} imports {imp}"
        for name, path in modules.items()
        if name.startswith(TRAINS)
        for imp in _imports(path, modules)
        if imp.startswith(PREDICT)
    ]
    assert not bad, bad


def test_predict_imports_no_torch_at_module_level():
    """The planner calls the estimator thousands of times, and a notebook predicts before any rank starts:
    importing every module of workbench.predict leaves torch unimported."""
    import subprocess
    import sys

    names = sorted(n for n in _modules() if n.startswith(PREDICT))
    code = (
        "import sys\n" + "".join(f"import {n}\n" for n in names) + "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", names


def test_zero_in_flight_bound_is_the_formulas():
    from workbench.parallel.zero import MAX_IN_FLIGHT
    from workbench.predict.formulas import ZERO_IN_FLIGHT

    assert MAX_IN_FLIGHT == ZERO_IN_FLIGHT


def test_the_model_knows_nothing_of_parallelism():
    modules = _modules()
    imported = _imports(modules["workbench.model.gpt"], modules)
    assert not [
        m for m in imported if m.startswith(("workbench.parallel", "workbench.pipeline"))
    ], imported


def test_no_import_cycle():
    """At run time: an import under TYPE_CHECKING (an annotation's) runs never and closes no cycle."""
    modules = _modules()
    graph = {
        name: {
            i
            for i in _imports(path, modules, run_time_only=True)
            if i != name and not name.startswith(f"{i}.")
        }
        for name, path in modules.items()
    }
    done: set[str] = set()

    def cycle_from(node: str, stack: list[str]) -> list[str] | None:
        """Depth-first: the first path that comes back to a module still on the stack."""
        if node in stack:
            return stack[stack.index(node) :] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            if found := cycle_from(nxt, stack + [node]):
                return found
        done.add(node)
        return None

    for name in sorted(graph):
        cycle = cycle_from(name, [])
        assert cycle is None, " → ".join(cycle)


def test_no_public_function_shares_its_name_with_a_submodule():
    """`import workbench.<name>` sets the package's attribute to the submodule: a function of that name
    (wb.compare, wb.estimate ...) would then be "module object is not callable"."""
    import workbench

    modules = {p.stem for p in ROOT.glob("*.py")} | {
        p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()
    }
    clashes = [name for name in workbench.__all__ if name in modules]
    assert not clashes, clashes


def test_notebooks_are_committed_without_outputs():
    """The builders (scripts/build_notebook_*.py) write them stripped: outputs saved by a JupyterLab session would
    reopen as "Error displaying widget: model not found" for every widget whose kernel is gone."""
    import json

    notebooks = sorted((ROOT.parent / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 9
    for path in notebooks:
        cells = json.loads(path.read_text())["cells"]
        with_outputs = [
            i for i, c in enumerate(cells) if c.get("outputs") or c.get("execution_count")
        ]
        assert not with_outputs, (
            f"{path.name}: cells {with_outputs} have outputs; run its scripts/build_notebook_*.py"
        )


def test_docs_lines_stay_within_120_characters():
    """As ruff holds the code (E501): README.md and docs/ read without a horizontal scroll (a table whose rows
    would not fit is a list)."""
    docs = [ROOT.parent / "README.md", *sorted((ROOT.parent / "docs").rglob("*.md"))]
    long = [
        f"{p.name}:{i}"
        for p in docs
        for i, line in enumerate(_written(p.read_text()).split("\n"), 1)
        if len(line) > 120
    ]
    assert not long, long


def _written(page: str) -> str:
    """A page less its generated claims ledger (scripts/claims_ledger.py): a table of every notebook's checks, one
    row each, read on the site, which no one edits by hand."""
    return re.sub(r"<!-- LEDGER: .*?<!-- /LEDGER -->", "", page, flags=re.S)


def test_the_readme_is_read_in_five_minutes():
    """The README is a front door (under 10 KB: what it is, two commands, what you will see, one example of
    each kind, where it runs, links); everything else lives in docs/, and each of its links leads to a file."""
    readme = ROOT.parent / "README.md"
    assert readme.stat().st_size < 10_000, (
        f"README.md is {readme.stat().st_size} bytes: move reference to docs/"
    )
    local = _relative_links(readme.read_text())
    assert len(local) >= 10, local
    missing = [link for link in local if not (ROOT.parent / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_every_docs_link_leads_to_a_file():
    """docs/ read on GitHub: each relative link leads to a file of the repository (a notebook link to the notebook,
    which the site's build turns into a link to its executed page), but for the pages the site generates
    (reference/: the CLI and API references)."""
    docs = ROOT.parent / "docs"
    dead = []
    for page in sorted(docs.rglob("*.md")):
        for link in _relative_links(page.read_text()):
            generated = (page.parent / link).resolve().is_relative_to(docs / "reference")
            if not generated and not (page.parent / link).exists():
                dead.append(f"{page.relative_to(docs)}: {link}")
    assert not dead, dead


def _relative_links(markdown: str) -> list[str]:
    """A Markdown text's links to files (not to a web address or an anchor of the same page), without anchors."""
    links = re.findall(r"\]\(([^)#\s]+)", markdown)
    return [link for link in links if "://" not in link and not link.startswith("mailto:")]
