"""Keyword-only construction (docs/architecture.md): past five positional arguments a call names them, and a
dataclass of three fields or more is built by keyword. ruff's PLR0917 (`make lint`) holds the definitions to
five positional parameters; this holds the calls and the dataclasses, which that rule does not see. Read with
`ast`, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "workbench"
#: a call may pass this many arguments by position (ruff's max-positional-args for the definitions)
MAX_POSITIONAL = 5
#: a dataclass with this many fields or more is keyword-only
KW_ONLY_FIELDS = 3


def positional_calls(source: str) -> list[tuple[int, str, int]]:
    """(line, callee, count) of every call passing more than MAX_POSITIONAL arguments by position (`*args`
    unpacked is not counted: its length is not in the code)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            n = sum(not isinstance(a, ast.Starred) for a in node.args)
            if n > MAX_POSITIONAL:
                found.append((node.lineno, ast.unparse(node.func), n))
    return found


def positional_dataclasses(source: str) -> list[tuple[int, str, int]]:
    """(line, class, fields) of every @dataclass of KW_ONLY_FIELDS fields or more without kw_only=True."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for deco in node.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            name = ast.unparse(call.func if call else deco)
            if name not in ("dataclass", "dataclasses.dataclass"):
                continue
            kw_only = call is not None and any(
                k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in call.keywords
            )
            fields = sum(
                isinstance(s, ast.AnnAssign) and "ClassVar" not in ast.unparse(s.annotation)
                for s in node.body
            )
            if fields >= KW_ONLY_FIELDS and not kw_only:
                found.append((node.lineno, node.name, fields))
    return found


def _scan(check) -> list[str]:
    return [
        f"{path.relative_to(ROOT.parent)}:{line} {name} ({n})"
        for path in sorted(ROOT.rglob("*.py"))
        for line, name, n in check(path.read_text())
    ]


def test_the_scans_catch_what_they_look_for():
    src = (
        "from dataclasses import dataclass, field\n"
        "@dataclass\nclass A:\n    x: int\n    y: int\n    z: int = 0\n"
        "@dataclass(frozen=True)\nclass B:\n    x: int\n    y: int\n    z: int\n"
        "@dataclass(kw_only=True)\nclass C:\n    x: int\n    y: int\n    z: int\n"
        "@dataclass\nclass D:\n    x: int\n    y: int\n"
        "f(1, 2, 3, 4, 5, 6)\nf(1, 2, 3, 4, 5, g=6)\nf(*xs, 1, 2, 3, 4, 5)\n"
    )
    assert [name for _, name, _ in positional_dataclasses(src)] == ["A", "B"]
    assert positional_calls(src) == [(21, "f", 6)]


def test_no_call_passes_more_than_five_arguments_by_position():
    found = _scan(positional_calls)
    assert not found, f"calls passing over {MAX_POSITIONAL} arguments by position: {found}"


def test_dataclasses_of_three_fields_or_more_are_keyword_only():
    found = _scan(positional_dataclasses)
    assert not found, f"dataclasses of {KW_ONLY_FIELDS}+ fields without kw_only=True: {found}"
