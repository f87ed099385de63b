"""bench/ holds scripts, not a package the rest imports: tests and the server import nothing
from it, and each script imports only the installed warmgate and its sibling scripts (so
`python bench/x.py` runs after a plain `pip install -e`; test_readme_commands runs them)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_nothing_outside_bench_imports_it() -> None:
    offenders = [str(p.relative_to(ROOT)) for folder in ("tests", "server", "client", "tools")
                 for p in sorted((ROOT / folder).rglob("*.py"))
                 if any(m == "bench" or m.startswith("bench.") for m in imported_modules(p))]
    assert offenders == []


def test_bench_scripts_import_only_warmgate_siblings_and_libraries() -> None:
    assert not (ROOT / "bench" / "__init__.py").exists()
    siblings = {p.stem for p in (ROOT / "bench").glob("*.py")}
    for script in sorted((ROOT / "bench").glob("*.py")):
        ours = {m.split(".")[0] for m in imported_modules(script)} & {"bench", "tests"}
        assert not ours, f"{script.name} imports {ours}"
        local = {m for m in imported_modules(script) if m.split(".")[0] in siblings}
        assert all("." not in m for m in local), f"{script.name}: {local}"
