"""A line on the terminal while one test runs long: `-q` prints a dot per test when it ends,
so a test of two minutes looked like a hang. Once the running test passes NOTICE_AFTER_S, and
every NOTICE_AFTER_S after, its name and time go on a line of their own.

Registered by tests/conftest.py (`register`); a thread of its own looks once a second."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Generator

import pytest

NOTICE_AFTER_S = 20.0
LOOK_EVERY_S = 1.0


class SlowTestNotice:
    def __init__(self, write_line: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write_line = write_line
        self._clock = clock
        self._lock = threading.Lock()
        self._test: str | None = None
        self._started = self._next_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, nodeid: str) -> None:
        with self._lock:
            self._test, self._started = nodeid, self._clock()
            self._next_at = self._started + NOTICE_AFTER_S

    def end(self) -> None:
        with self._lock:
            self._test = None

    def due(self) -> str | None:
        """The notice to print now, if one is due."""
        now = self._clock()
        with self._lock:
            if self._test is None or now < self._next_at:
                return None
            # The first notice of a test leaves the line of dots it interrupts.
            first = self._next_at == self._started + NOTICE_AFTER_S
            self._next_at = now + NOTICE_AFTER_S
            return (f"{chr(10) if first else ''}  ... {self._test} still running: "
                    f"{now - self._started:.0f} s")

    def _run(self) -> None:
        while not self._stop.wait(LOOK_EVERY_S):
            notice = self.due()
            if notice is not None:
                self._write_line(notice)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="slow-test-notice",
                                            daemon=True)
            self._thread.start()
        self.begin(item.nodeid)
        try:
            yield
        finally:
            self.end()

    def pytest_unconfigure(self) -> None:
        self._stop.set()


def register(config: pytest.Config) -> None:
    """Add the notice to a session, from a `pytest_configure` that runs after the terminal
    reporter's (trylast): not where no terminal reporter prints (-p no:terminal)."""
    if config.pluginmanager.get_plugin("terminalreporter") is None:
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
