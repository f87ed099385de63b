"""The suite's progress: a test that runs long prints its name and time on a line of its own
while it runs, then every interval; short tests print nothing but their dot."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import slow_test_notice
from tests.slow_test_notice import SlowTestNotice

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_long_test_is_named_once_per_interval() -> None:
    clock = Clock()
    notice = SlowTestNotice(lambda _line: None, clock)
    notice.begin("tests/test_x.py::test_short")
    clock.now += slow_test_notice.NOTICE_AFTER_S - 1
    assert notice.due() is None
    notice.end("tests/test_x.py::test_short")
    clock.now += 10 * slow_test_notice.NOTICE_AFTER_S
    assert notice.due() is None  # nothing runs
    notice.begin("tests/test_x.py::test_long")
    clock.now += slow_test_notice.NOTICE_AFTER_S
    assert notice.due() == "\n  ... tests/test_x.py::test_long still running: 20 s"
    assert notice.due() is None
    clock.now += slow_test_notice.NOTICE_AFTER_S
    assert notice.due() == "  ... tests/test_x.py::test_long still running: 40 s"


def test_two_tests_at_once_are_each_noticed() -> None:
    """Under pytest-xdist two workers run a test each; both are followed."""
    clock = Clock()
    notice = SlowTestNotice(lambda _line: None, clock)
    notice.begin("tests/test_a.py::test_one")
    clock.now += 5
    notice.begin("tests/test_b.py::test_two")
    clock.now += slow_test_notice.NOTICE_AFTER_S - 5
    assert notice.due() == "\n  ... tests/test_a.py::test_one still running: 20 s"
    clock.now += 5
    assert notice.due() == "\n  ... tests/test_b.py::test_two still running: 20 s"
    notice.end("tests/test_a.py::test_one")
    clock.now += slow_test_notice.NOTICE_AFTER_S
    assert notice.due() == "  ... tests/test_b.py::test_two still running: 40 s"


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_pytest_prints_the_notice_while_the_test_runs(tmp_path: Path, workers: list[str]
                                                      ) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import pytest
        from tests import slow_test_notice
        slow_test_notice.NOTICE_AFTER_S, slow_test_notice.LOOK_EVERY_S = 0.5, 0.05

        @pytest.hookimpl(trylast=True)
        def pytest_configure(config):
            slow_test_notice.register(config)
    """))
    (tmp_path / "test_two.py").write_text(textwrap.dedent("""
        import time

        def test_quick():
            pass

        def test_slow():
            time.sleep(1.8)
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", *workers, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notices = [line for line in proc.stdout.splitlines() if "still running" in line]
    assert notices and all("test_two.py::test_slow still running" in n for n in notices), \
        proc.stdout
    assert "2 passed" in proc.stdout
