"""Which tests a run includes: the `slow` ones (real server processes, the reference models,
mypy, every bench command, ...) only when asked, so the suite a contributor runs often stays
short; CI asks (.ci/run).

Asked means any of: `--slow`, `WARMGATE_SLOW_TESTS=1`, a `-m` expression that names `slow`,
or test files or ids given on the command line (then what was named runs, slow or not)."""

from __future__ import annotations

import os

import pytest

ENV = "WARMGATE_SLOW_TESTS"


def add_option(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true",
                     help=f"also run the tests marked slow (CI does; {ENV}=1 does the same)")


def wanted(config: pytest.Config) -> bool:
    return (bool(config.getoption("--slow")) or os.environ.get(ENV) == "1"
            or "slow" in (config.getoption("markexpr") or "")
            or config.args_source is pytest.Config.ArgsSource.ARGS)


def deselect(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the slow tests out unless asked for; when they run, their files go first."""
    if wanted(config):
        slow_files_first(items)
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def slow_files_first(items: list[pytest.Item]) -> None:
    """Every file holding a slow test ahead of the others, each file's tests together and in
    their order (a file's module-scoped fixtures are set up once). Workers of xdist take the
    tests in this order: the long ones start while the short ones are left to even out the
    end, instead of a file of minutes starting last beside an idle worker."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept within
