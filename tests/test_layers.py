"""The server's layers, read from the source with `ast` (nothing is imported or executed).

Packages are the first level under warmgate.server (config, runner, warmup, ...); a top-level
module (main, app, prewarm, startup, run_warmup, tp_worker) is its own node. Every module of a
package belongs to it, a `__main__` program too: a program that imports from several floors
lives at the top, beside main.py. Every import counts, lazy ones inside functions and
`TYPE_CHECKING` ones included: a dependency deferred is still a dependency. Cycles are looked
for twice: between packages, and between the modules themselves (inside a package too).

The direction the rules keep:
core <- config <- (runner, kernels, jit, cache, text) <- warmup, serving <- control <- api
<- app, main, startup, prewarm; telemetry sits under the callers it reports for (warmup,
control, api) and over what it reports on (serving's step statistics).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "server" / "warmgate" / "server"
PACKAGE = "warmgate.server"
GRPC_MODULES = ("grpc", "grpc_health", "grpc_reflection", "google.rpc", "warmgate.v1")
# The gRPC layer: the api package and the modules that assemble and start the server.
GRPC_LAYER = ("api", "main", "app", "prewarm")
# The libraries the warmup plan and the serving loop are built from, and what sits above them.
LIBRARIES = ("runner", "kernels", "jit", "cache", "text")
ABOVE_LIBRARIES = ("warmup", "serving", "control", "api", "telemetry", "main", "app", "prewarm",
                   "startup")

# Temporary offenders, to be emptied: api/prompt.py still reads the Generate proto. Each entry
# that no longer offends fails test_the_allow_lists_hold_only_live_offenders.
ALLOWED_EDGES: set[tuple[str, str]] = set()
ALLOWED_GRPC: set[str] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(SERVER.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, name: str) -> set[str]:
    """Every module `path` imports, as absolute names; `from x import y` yields x and x.y
    (y may be a submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def server_modules() -> dict[str, set[str]]:
    """{module: the modules it imports} for every module of warmgate.server."""
    modules = {}
    for path in sorted(SERVER.rglob("*.py")):
        name = module_name(path)
        modules[name] = imported_names(path, name)
    return modules


def node_of(module: str) -> str | None:
    """The layer node of a warmgate.server module; None for anything outside it."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    parts = module.split(".")[2:]
    return parts[0] if parts else PACKAGE


def is_under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def internal_edges(modules: Mapping[str, set[str]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """{(node, node): the module edges behind it} between different nodes, known modules only,
    without the allowed edges."""
    edges: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
    for source, targets in modules.items():
        for target in targets:
            if target not in modules or (source, target) in ALLOWED_EDGES:
                continue
            a, b = node_of(source), node_of(target)
            if a is not None and b is not None and a != b and b != PACKAGE:
                edges[(a, b)].add((source, target))
    return edges


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def modules() -> dict[str, set[str]]:
    found = server_modules()
    assert len(found) > 100 and f"{PACKAGE}.config.server_config" in found, sorted(found)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_one() -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": ["c"], "d": ["a"]}) == []


def test_no_package_level_cycle(modules: dict[str, set[str]]) -> None:
    edges = internal_edges(modules)
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    found = cycles(graph)
    detail = [sorted(e for (a, b), es in edges.items() if a in c and b in c for e in es)
              for c in found]
    assert not found, f"package cycles {found}, through the imports {detail}"


def module_graph(modules: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """{module: the warmgate.server modules it imports}, a package's __init__ included."""
    return {source: {t for t in targets if t in modules and t != source}
            for source, targets in modules.items()}


def test_the_module_graph_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """A cycle that hides in a function body or under TYPE_CHECKING is still found."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 f"    from {PACKAGE}.pkg.b import B\n")
    b.write_text(f"def f():\n    from {PACKAGE}.pkg import a\n")
    found = {f"{PACKAGE}.pkg.a": imported_names(a, f"{PACKAGE}.pkg.a"),
             f"{PACKAGE}.pkg.b": imported_names(b, f"{PACKAGE}.pkg.b")}
    assert cycles(module_graph(found)) == [[f"{PACKAGE}.pkg.a", f"{PACKAGE}.pkg.b"]]


def test_no_module_cycle(modules: dict[str, set[str]]) -> None:
    """No two modules of the server import each other, directly or round a loop: every
    module can be read (and imported) after the ones it uses."""
    found = cycles(module_graph(modules))
    assert not found, f"module cycles: {found}"


def test_core_imports_nothing_of_warmgate(modules: dict[str, set[str]]) -> None:
    bad = sorted((m, t) for m, ts in modules.items() if node_of(m) == "core"
                 for t in ts if is_under(t, ("warmgate",)) and node_of(t) != "core")
    assert not bad, f"core/ must stay at the bottom: {bad}"


def test_config_imports_only_core_and_config(modules: dict[str, set[str]]) -> None:
    bad = sorted((m, t) for m, ts in modules.items() if node_of(m) == "config"
                 for t in ts if is_under(t, ("warmgate",))
                 and node_of(t) not in ("core", "config"))
    assert not bad, f"config/ is the layer under every other: {bad}"


def grpc_offenders(modules: Mapping[str, set[str]]) -> dict[str, list[str]]:
    offenders: dict[str, list[str]] = {}
    for module, targets in modules.items():
        if node_of(module) in GRPC_LAYER:
            continue
        hits = sorted(t for t in targets if is_under(t, GRPC_MODULES))
        if hits:
            offenders[module] = hits
    return offenders


def test_grpc_only_in_the_grpc_layer(modules: dict[str, set[str]]) -> None:
    bad = {m: ts for m, ts in grpc_offenders(modules).items() if m not in ALLOWED_GRPC}
    assert not bad, f"gRPC and the protos belong to api/, main, app and prewarm: {bad}"


def test_the_libraries_import_nothing_above_them(modules: dict[str, set[str]]) -> None:
    """runner/ and kernels/ (and jit/, cache/, text/ beside them) sit under the warmup plan,
    the serving loop and the server."""
    above = [f"{PACKAGE}.{n}" for n in ABOVE_LIBRARIES]
    bad = sorted((m, t) for m, ts in modules.items() if node_of(m) in LIBRARIES
                 for t in ts if is_under(t, above))
    assert not bad, f"{', '.join(LIBRARIES)} must not import {', '.join(ABOVE_LIBRARIES)}: {bad}"


def test_the_allow_lists_hold_only_live_offenders(modules: dict[str, set[str]]) -> None:
    stale_edges = {(a, b) for a, b in ALLOWED_EDGES if b not in modules.get(a, set())}
    stale_grpc = ALLOWED_GRPC - set(grpc_offenders(modules))
    assert not stale_edges and not stale_grpc, \
        f"no longer needed, remove from tests/test_layers.py: {stale_edges} {stale_grpc}"


MAX_MODULE_LINES = 300


def test_no_server_module_is_over_300_lines() -> None:
    """A module that outgrows one screenful of purposes is split by purpose."""
    long = {str(p.relative_to(SERVER)): n for p in SERVER.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by purpose: {long}"
