"""A line on the terminal while a test runs long: `-q` prints a dot per test when it ends,
so a test of two minutes looked like a hang. Once a running test passes NOTICE_AFTER_S, and
every NOTICE_AFTER_S after, its name and time go on a line of their own.

Registered by tests/conftest.py (`register`); a thread of its own looks once a second. It
follows the tests through the log hooks (`pytest_runtest_logstart` / `logfinish`), which
pytest-xdist also calls in the controlling process for each test a worker starts and ends:
with `-n 2` two tests run at once, each noticed on its own, and the workers, which have no
terminal, print nothing."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import pytest

NOTICE_AFTER_S = 20.0
LOOK_EVERY_S = 1.0


class SlowTestNotice:
    def __init__(self, write_line: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write_line = write_line
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[str, tuple[float, float]] = {}  # nodeid -> (started, next notice)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, nodeid: str) -> None:
        with self._lock:
            now = self._clock()
            self._running[nodeid] = (now, now + NOTICE_AFTER_S)

    def end(self, nodeid: str) -> None:
        with self._lock:
            self._running.pop(nodeid, None)

    def due(self) -> str | None:
        """The notices to print now (a line per test due), if any is due."""
        now = self._clock()
        lines = []
        first = False
        with self._lock:
            for nodeid, (started, next_at) in self._running.items():
                if now < next_at:
                    continue
                # A test's first notice leaves the line of dots it interrupts.
                first = first or next_at == started + NOTICE_AFTER_S
                self._running[nodeid] = (started, now + NOTICE_AFTER_S)
                lines.append(f"  ... {nodeid} still running: {now - started:.0f} s")
        if not lines:
            return None
        return ("\n" if first else "") + "\n".join(lines)

    def _run(self) -> None:
        while not self._stop.wait(LOOK_EVERY_S):
            notice = self.due()
            if notice is not None:
                self._write_line(notice)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="slow-test-notice",
                                            daemon=True)
            self._thread.start()
        self.begin(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.end(nodeid)

    def pytest_unconfigure(self) -> None:
        self._stop.set()


def register(config: pytest.Config) -> None:
    """Add the notice to a session, from a `pytest_configure` that runs after the terminal
    reporter's (trylast): not where no terminal reporter prints (-p no:terminal), nor in an
    xdist worker (the controlling process notices its tests)."""
    if (config.pluginmanager.get_plugin("terminalreporter") is None
            or hasattr(config, "workerinput")):
        return
    config.pluginmanager.register(SlowTestNotice(terminal_writer()), "slow-test-notice")


def terminal_writer() -> Callable[[str], None]:
    """Writes a line where pytest's dots go, also while a test runs: output capture then
    points file descriptor 1 at a temporary file, so a copy of the descriptor is taken now,
    while capture is suspended, and written to instead."""
    try:
        terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1,
                             encoding="utf-8", errors="replace")
    except (OSError, ValueError, AttributeError):  # no real stdout (pytest run in-process)
        return lambda _line: None
    return lambda line: print(line, file=terminal, flush=True)
