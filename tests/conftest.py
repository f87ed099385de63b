"""Loaded before any test module is imported. Without CUDA, the Triton kernels run in the
interpreter, and Triton reads TRITON_INTERPRET when a kernel is defined: the moment the first
module that imports the runner's kernels is collected, whichever test file that is. So the
switch is set here, once, before collection, not in the files that test the kernels.

Also here: the interpreter's nested patching skipped (tests/interpreter_patching.py); each
xdist worker's share of the cores for torch's threads; the notice that names a test running
long (tests/slow_test_notice.py); and the slow tests left out unless asked for
(tests/slow_tests.py)."""

from __future__ import annotations

import os

import pytest
import torch

from tests import interpreter_patching, slow_test_notice, slow_tests
from warmgate.server.cpu_threads import usable_cpus

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    interpreter_patching.skip_nested_patches()  # why: tests/interpreter_patching.py

# Under xdist each worker is a process with torch's default of a thread per core: two
# workers on two cores ran four busy threads, each parallel op waiting at its barrier for a
# descheduled one. A worker's share of the cores ran four of the heaviest files in 62 s
# instead of 132 s on the 2-core CI machine. (Servers the tests start set their own.)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, usable_cpus() // _WORKERS))


@pytest.hookimpl(trylast=True)  # after the terminal reporter exists
def pytest_configure(config: pytest.Config) -> None:
    slow_test_notice.register(config)  # a test that runs long says so on the terminal


def pytest_addoption(parser: pytest.Parser) -> None:
    slow_tests.add_option(parser)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_tests.deselect(config, items)  # the slow tests run when asked for (--slow, CI)
