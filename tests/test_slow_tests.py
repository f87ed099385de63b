"""The suite a contributor runs often leaves the slow tests out, unless asked for: --slow, the
environment variable CI sets, a -m expression naming them, or the tests named on the command
line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    (folder / "conftest.py").write_text(textwrap.dedent("""
        from tests import slow_tests

        def pytest_addoption(parser):
            slow_tests.add_option(parser)

        def pytest_collection_modifyitems(config, items):
            slow_tests.deselect(config, items)
    """))
    (folder / "test_both.py").write_text(textwrap.dedent("""
        import pytest

        def test_quick():
            pass

        @pytest.mark.slow
        def test_heavy():
            pass
    """))
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    return folder


def outcome(project: Path, *args: str, **env: str) -> tuple[int, int]:
    environ = {k: v for k, v in os.environ.items() if k != "WARMGATE_SLOW_TESTS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=project, env={**environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    passed = re.search(r"(\d+) passed", proc.stdout)
    deselected = re.search(r"(\d+) deselected", proc.stdout)
    return (int(passed.group(1)) if passed else 0,
            int(deselected.group(1)) if deselected else 0)


def test_the_slow_tests_are_left_out_by_default(project: Path) -> None:
    assert outcome(project) == (1, 1)
    assert outcome(project, "-m", "not gpu") == (1, 1)  # the README's command


@pytest.mark.parametrize(("args", "env"), [
    (["--slow"], {}),
    ([], {"WARMGATE_SLOW_TESTS": "1"}),
    (["test_both.py"], {}),
])
def test_asked_for_they_run(project: Path, args: list[str], env: dict[str, str]) -> None:
    assert outcome(project, *args, **env) == (2, 0)


def test_a_marker_expression_naming_them_picks_them(project: Path) -> None:
    assert outcome(project, "-m", "slow") == (1, 1)


def test_ci_asks_for_them() -> None:
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "export WARMGATE_SLOW_TESTS=1" in run


class _Item:
    """A collected test as slow_files_first sees it: its file and whether it is marked slow."""

    def __init__(self, name: str, path: str, slow: bool) -> None:
        self.name, self.path, self.slow = name, Path(path), slow

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def test_asked_for_the_files_holding_slow_tests_go_first_each_in_its_order() -> None:
    from tests.slow_tests import slow_files_first

    items = [_Item("a1", "a.py", False), _Item("b1", "b.py", False), _Item("b2", "b.py", True),
             _Item("c1", "c.py", False), _Item("d1", "d.py", True), _Item("d2", "d.py", False)]
    slow_files_first(items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["b1", "b2", "d1", "d2", "a1", "c1"]
