"""bench/ is a toolbox, not a package the rest imports: a few entry points, one per question a
user asks (bench/warm.py, start.py, serve.py, load.py), each running the scripts of bench/lib/
as its commands. Tests and the server import nothing from it; an entry imports only
bench/lib/toolbox.py, and a script only the installed warmgate and its neighbours in lib/ (so
`python bench/ENTRY.py COMMAND` runs after a plain `pip install -e`; test_readme_commands runs
every one README shows)."""

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


ENTRIES = ("warm", "start", "serve", "load")


def test_bench_holds_only_the_entry_points() -> None:
    assert sorted(p.stem for p in (ROOT / "bench").glob("*.py")) == sorted(ENTRIES)


def test_an_entry_point_imports_only_the_toolbox() -> None:
    lib = {p.stem for p in (ROOT / "bench" / "lib").glob("*.py")}
    for entry in ENTRIES:
        ours = imported_modules(ROOT / "bench" / f"{entry}.py") & lib
        assert ours == {"toolbox"}, f"{entry}.py imports {ours}"


def test_each_command_runs_a_script_of_lib() -> None:
    from tests.bench_harness import load_script

    for entry in ENTRIES:
        for name, command in load_script(f"bench/{entry}.py").COMMANDS.items():
            script = ROOT / "bench" / "lib" / command.script
            assert script.is_file() and "__main__" in script.read_text(), (entry, name)


def test_bench_scripts_import_only_warmgate_siblings_and_libraries() -> None:
    for folder in (ROOT / "bench", ROOT / "bench" / "lib"):
        assert not (folder / "__init__.py").exists()
    siblings = {p.stem for p in (ROOT / "bench" / "lib").glob("*.py")}
    for script in sorted((ROOT / "bench").rglob("*.py")):
        ours = {m.split(".")[0] for m in imported_modules(script)} & {"bench", "tests", "lib"}
        assert not ours, f"{script.name} imports {ours}"
        local = {m for m in imported_modules(script) if m.split(".")[0] in siblings}
        assert all("." not in m for m in local), f"{script.name}: {local}"
