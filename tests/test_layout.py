"""The package layout rules of DESIGN.md: dependencies point one way
(gateway -> channels, scheduler -> runtime) and no module imports form a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "channels", "runtime", "scheduler")
# what each top-level package may import among ours
ALLOWED = {
    "gateway": {"gateway", "channels", "runtime", "scheduler"},
    "channels": {"channels", "runtime"},
    "scheduler": {"scheduler", "runtime"},
    "runtime": {"runtime"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def test_dependencies_point_one_way():
    bad = [f"{a} -> {b}" for a, deps in _import_graph().items() for b in deps
           if b.split(".")[0] not in ALLOWED[a.split(".")[0]]]
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _cycles(_import_graph()) == []


def test_one_package_per_platform():
    for platform in ("telegram", "slack", "discord"):
        assert (ROOT / "channels" / platform / "__init__.py").is_file()
        assert not list((ROOT / "channels").glob(f"{platform}_*.py"))
    assert not list((ROOT / "runtime").glob("timeline*.py"))
    assert not list((ROOT / "gateway").glob("cli*.py"))
