"""No private name crosses a package: `from workbench.X.y import _z` only inside package X. What another
package needs is public (or lives where it is used). Read from the source with `ast`: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "workbench"


def package_of(module: str) -> str:
    """'workbench.predict.action_costs' → 'workbench.predict' (a top-level module is its own package)."""
    return ".".join(module.split(".")[:2])


def private_imports(source: str, module: str) -> list[str]:
    """`from M import _name` lines of `source` (the module `module`) where M is another package's module."""
    tree = ast.parse(source)
    here = package_of(module)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if not node.module.startswith("workbench.") or package_of(node.module) == here:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{module}:{node.lineno}: from {node.module} import {alias.name}")
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_scan_catches_a_private_name_from_another_package():
    source = (
        "from workbench.predict.action_costs import Layout, _ctx\n"
        "def f():\n"
        "    from workbench.predict.step_time import _pipeline\n"
        "from workbench.analysis.run import _own_package\n"  # the same package: allowed
        "from workbench.trace.recorder import __all__\n"  # a dunder is not private
    )
    found = private_imports(source, "workbench.analysis.scaling")
    assert found == [
        "workbench.analysis.scaling:1: from workbench.predict.action_costs import _ctx",
        "workbench.analysis.scaling:3: from workbench.predict.step_time import _pipeline",
    ]


def test_no_private_name_is_imported_from_another_package():
    found = [
        line
        for path in sorted(ROOT.rglob("*.py"))
        for line in private_imports(path.read_text(), _module_name(path))
    ]
    assert not found, "make what another package uses public, or move it there:\n" + "\n".join(
        found
    )
