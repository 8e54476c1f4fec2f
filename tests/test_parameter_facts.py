"""A parameter's facts are said once, in a typed table (parallel/param_facts.py): nothing sticks an attribute
on a Parameter (or any tensor) for another file to find. The scan reads the source with `ast`, so nothing
is imported or run; the last test asks a real table about a tensor it does not list.

What counts as a tensor, in each function: a name bound to `nn.Parameter(...)` or a torch factory; an
argument annotated as a Tensor or Parameter; the loop variable over a model's `parameters()` /
`named_parameters()` / `buffers()`, over a collection named like parameters (`params`, `self.params`,
`shards`, `masters` …), over a literal of tensors, through `zip` and `enumerate`; an element of such a
collection; `x.weight`, `x.bias`, `x.shard`, `x.grad`, `x.data`; and whatever `getattr(...)` returns. On
such a tensor only torch's own settable attributes may be assigned (`grad`, `data`, `requires_grad`);
`setattr(tensor, ...)`, `vars(tensor)` and `tensor.__dict__` are refused too."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.engine.parallelize import materialize
from workbench.parallel.param_facts import PLAIN, ParamFacts, ParamTable, UnknownParameterError

ROOT = Path(__file__).resolve().parent.parent / "workbench"
#: what torch's Tensor declares and lets its users set: gradients as bucket views, ZeRO's flat views
TORCH_OWN = {"grad", "data", "requires_grad"}
#: attributes that hold a tensor (a module's parameters, a ZeRO bucket's slice, a tensor's own gradient)
TENSOR_ATTRS = {"weight", "bias", "shard", "grad", "data", "main_grad"}
#: methods that return a module's tensors; the `named_` ones yield (name, tensor)
TENSOR_ITERS = {"parameters", "buffers", "named_parameters", "named_buffers"}
#: collections named for what they hold
TENSOR_COLLECTIONS = ("param", "shards", "masters", "grads", "tensors")
FACTORIES = {
    "Parameter",
    "empty",
    "zeros",
    "ones",
    "full",
    "randn",
    "rand",
    "tensor",
    "arange",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
}


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


class _Scope:
    """The tensors of one function (or a module's top level), and what is assigned on them."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def is_tensor(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.names
        if isinstance(node, ast.Attribute):
            return node.attr in TENSOR_ATTRS
        if isinstance(node, ast.Call):  # getattr(module, leaf) is a parameter as often as not
            return isinstance(node.func, ast.Name) and node.func.id == "getattr"
        if isinstance(node, ast.Subscript):
            return self.is_collection(node.value)
        return False

    def is_collection(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in TENSOR_ITERS:
                return True
        if isinstance(node, ast.Tuple | ast.List):
            return bool(node.elts) and all(
                self.is_tensor(e) or isinstance(e, ast.Constant) for e in node.elts
            )
        name = _last_name(node)
        return name is not None and any(word in name.lower() for word in TENSOR_COLLECTIONS)

    def bind_loop(self, target: ast.expr, iterable: ast.expr) -> None:
        """Add the loop variables that take tensors from `iterable`."""
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name):
            if iterable.func.id == "zip" and isinstance(target, ast.Tuple):
                for t, it in zip(target.elts, iterable.args, strict=False):
                    self.bind_loop(t, it)
                return
            if iterable.func.id == "enumerate" and isinstance(target, ast.Tuple):
                if iterable.args and len(target.elts) == 2:
                    self.bind_loop(target.elts[1], iterable.args[0])
                return
        if not self.is_collection(iterable):
            return
        named = (
            isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Attribute)
            and iterable.func.attr.startswith("named_")
        )
        if named and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            target = target.elts[1]
        if isinstance(target, ast.Name):
            self.names.add(target.id)


def _tensor_names(fn: ast.AST) -> _Scope:
    scope = _Scope(set())
    if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
            if arg.annotation is not None and any(
                word in ast.unparse(arg.annotation) for word in ("Tensor", "Parameter")
            ):
                if "[" not in ast.unparse(arg.annotation):  # a tensor, not a list of them
                    scope.names.add(arg.arg)
    for _ in range(2):  # a name bound from another bound later in the text
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                called = _last_name(node.value.func)
                if called in FACTORIES:
                    scope.names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if scope.is_tensor(node.value):
                    scope.names |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.For | ast.AsyncFor):
                scope.bind_loop(node.target, node.iter)
            elif isinstance(node, ast.comprehension):
                scope.bind_loop(node.target, node.iter)
    return scope


def _assigned(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    else:
        return []
    out: list[ast.expr] = []
    for t in targets:
        out += list(t.elts) if isinstance(t, ast.Tuple | ast.List) else [t]
    return out


def stuck_on_tensors(source: str, where: str = "<snippet>") -> list[str]:
    """Every place in `source` that sets an attribute on a tensor other than torch's own."""
    tree = ast.parse(textwrap.dedent(source))
    found: set[str] = set()
    scopes = [tree] + [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for fn in scopes:
        scope = _tensor_names(fn)
        for node in ast.walk(fn):
            for target in _assigned(node):
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr not in TORCH_OWN
                    and scope.is_tensor(target.value)
                ):
                    found.add(f"{where}:{node.lineno}: {ast.unparse(target)} = …")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("setattr", "vars") and node.args:
                    if scope.is_tensor(node.args[0]):
                        found.add(f"{where}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Attribute) and node.attr == "__dict__":
                if scope.is_tensor(node.value):
                    found.add(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_no_fact_is_stuck_on_a_parameter():
    """The facts live in parallel/param_facts.py's table, the main gradients in MainGrads: the code sets
    nothing on a parameter but torch's own `grad` and `data`."""
    found = [
        hit
        for path in sorted(ROOT.rglob("*.py"))
        for hit in stuck_on_tensors(path.read_text(), str(path.relative_to(ROOT.parent)))
    ]
    assert found == [], "attributes set on tensors outside torch's own:\n" + "\n".join(found)


#: every way the code once stuck a fact on a parameter (before issue 50), and the other spellings of it
STUCK = {
    "a new ZeRO slice": """
        def bucket(params, flat, mine):
            shard = nn.Parameter(flat[mine])
            shard.decay_ranges = marked_runs(params, mine.start, mine.stop)
            shard.zero_group = "dp"
    """,
    "the result of getattr": """
        def shard_experts(module, leaf):
            getattr(module, leaf).expert_sharded = True
    """,
    "each of a sync's params": """
        class Naive:
            def __init__(self, model):
                self.params = list(model.parameters())
                for p in self.params:
                    p.main_grad = torch.zeros_like(p)
    """,
    "a zip of params and views": """
        def main_grads_as_views(params, flat):
            for p, view in zip(params, views(flat, params), strict=True):
                p.main_grad = view
    """,
    "a module's own weight": """
        class Row(nn.Module):
            def __init__(self):
                self.weight = nn.Parameter(torch.empty(3, 4))
                self.weight.tp_sharded = True
                self.bias.sequence_parallel_partial = True
    """,
    "a literal of weight and bias": """
        def mark(self):
            for p in (self.weight, self.bias):
                p.tp_sharded = True
    """,
    "a module's parameters": """
        def mark(module):
            for p in module.parameters(recurse=False):
                p.sequence_parallel_partial = True
    """,
    "named parameters": """
        def mark_decay(model):
            for name, p in model.named_parameters():
                p.decays = p.dim() >= 2
    """,
    "marks copied through vars": """
        def materialize(module):
            for name, p in module.named_parameters(remove_duplicate=False):
                vars(p).update(marks[name])
    """,
    "setattr on a parameter": """
        def mark(p: nn.Parameter):
            setattr(p, "decays", False)
    """,
    "an annotated tensor": """
        def mark(t: torch.Tensor):
            t.owner = "me"
    """,
    "a tuple target": """
        def mark(params):
            for p in params:
                p.a, p.b = 1, 2
    """,
    "an element of a collection": """
        def mark(shards):
            shards[0].group = "dp"
    """,
    "a tensor's __dict__": """
        def mark(model):
            for p in model.parameters():
                p.__dict__["x"] = 1
    """,
}


@pytest.mark.parametrize("snippet", STUCK.values(), ids=STUCK.keys())
def test_the_scan_finds_each_way_a_fact_was_stuck_on_a_parameter(snippet):
    assert stuck_on_tensors(snippet), "the scan must fail on this"


def test_the_scan_leaves_torch_s_own_attributes_and_other_objects_alone():
    """Not vacuous the other way: gradients as bucket views, ZeRO's flat views, tying a head, a record's
    fields, a module's own attributes are what the code does, and pass."""
    fine = """
        class Sync:
            def __init__(self, model, flat):
                self.params = list(model.parameters())
                self.sections = (1, 2)
                for p, view in zip(self.params, views(flat, self.params), strict=True):
                    p.data = view
                    p.grad = None
                    p.requires_grad = True
                shard = nn.Parameter(flat[:4])
                shard.grad = torch.zeros_like(shard)

            def tie(self):
                self.head.weight = self.wte.weight

            def step(self, bucket):
                bucket.ready = 0
                bucket.handle, bucket.staging = None, None
    """
    assert stuck_on_tensors(fine) == []


def test_a_table_is_strict_about_a_parameter_it_does_not_list():
    """A parameter recreated after its facts were taken (here: materialised from meta, which makes new
    Parameter objects) is not silently plain — a tp shard would lose its norm's sum over tp, a gain its
    exemption from decay. The lookup raises and says why; a piece built on its own says `plain`."""
    with torch.device("meta"):
        model = nn.Linear(4, 3)
    facts = ParamTable({p: ParamFacts(tp_sharded=True) for p in model.parameters()})
    materialize(model, torch.device("cpu"))
    with pytest.raises(UnknownParameterError, match=r"shape \(3, 4\).*recreated"):
        facts[model.weight]
    assert model.weight not in facts and facts.get(model.weight) is None

    plain = ParamTable.plain(model.parameters())
    assert [plain[p] for p in model.parameters()] == [PLAIN, PLAIN]
    with pytest.raises(UnknownParameterError):
        plain[nn.Parameter(torch.zeros(2))]
