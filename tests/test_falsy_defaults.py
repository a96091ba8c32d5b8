"""No ``x or Default()`` where ``Default`` is a container-like class of ours.

An object with ``__len__`` (or ``__bool__``) is falsy while empty, so ``given or Default()``
silently throws away an injected, empty instance: the heartbeat's file-backed alert ledger
(empty at first start) was replaced by a memory-only one, and ``delivered.json`` was never
written. Such defaults must be spelled ``given if given is not None else Default()``.
This test reads the source (no import) and names every offending line.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.helpers import ROOT

PACKAGES = ("gateway", "channels", "runtime", "scheduler")
CONTAINER_BASES = {"dict", "list", "set", "frozenset", "tuple", "OrderedDict", "deque",
                   "defaultdict", "Counter", "UserDict", "UserList", "Mapping",
                   "MutableMapping", "Sequence", "MutableSequence", "Set", "MutableSet"}


@functools.cache
def _trees() -> list[tuple[Path, ast.Module]]:
    out: list[tuple[Path, ast.Module]] = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out.append((path, ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return out


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # OrderedDict[str, int]
        return _name(node.value)
    return None


def falsy_classes(trees: list[tuple[Path, ast.Module]]) -> set[str]:
    """Names of our classes whose empty instances are falsy (``__len__``/``__bool__``, or a
    container base), closed over subclassing."""
    bases: dict[str, set[str]] = {}
    falsy: set[str] = set()
    for _path, tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            names = {_name(b) for b in node.bases} - {None}
            bases.setdefault(node.name, set()).update(names)  # type: ignore[arg-type]
            methods = {f.name for f in node.body
                       if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if methods & {"__len__", "__bool__"} or names & CONTAINER_BASES:
                falsy.add(node.name)
    grew = True
    while grew:
        grew = False
        for cls, parents in bases.items():
            if cls not in falsy and parents & falsy:
                falsy.add(cls)
                grew = True
    return falsy


def offenders(trees: list[tuple[Path, ast.Module]], falsy: set[str]) -> list[str]:
    found = []
    for path, tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)):
                continue
            for value in node.values[1:]:
                if isinstance(value, ast.Call) and _name(value.func) in falsy:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                                 f"{ast.unparse(node)}")
    return found


def test_the_scan_knows_the_containers_it_guards():
    falsy = falsy_classes(_trees())
    # the heartbeat ledger, the inbound dedupe and the session store are all len()-able
    assert {"DeliveryDeduper", "InboundDedupe", "SessionStore"} <= falsy


def test_the_scan_finds_the_pattern():
    tree = ast.parse("class Box:\n    def __len__(self):\n        return 0\n"
                     "class Sub(Box):\n    pass\n"
                     "def f(box=None):\n    return box or Sub()\n")
    trees = [(ROOT / "x.py", tree)]
    assert offenders(trees, falsy_classes(trees)) == ["x.py:7: box or Sub()"]


def test_no_falsy_container_is_replaced_by_a_default():
    trees = _trees()
    assert offenders(trees, falsy_classes(trees)) == []
