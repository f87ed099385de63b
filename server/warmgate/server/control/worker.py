"""RunnerWorker: the one thread that touches the runner, and the order of its jobs.

All runner work (load, the warmup plan, mixed warmups, the serving loop) runs on one
dedicated thread, one job at a time: the event loop only awaits it, so health checks are
answered while kernels compile. An asyncio.Lock orders the jobs (not
`maximum_concurrent_rpcs=1`, which would also turn health checks away). Progress reaches the
loop through `call_soon_threadsafe`, before the job's own completion, so watchers see every
phase end.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from warmgate.server.control.status import StatusTracker
from warmgate.server.core.errors import ShuttingDown
from warmgate.server.core.progress import ProgressCallback, ProgressEvent

T = TypeVar("T")
# wait_idle polls the worker's flag: only a shutdown waits on it, and the poll is short
# against its grace period.
IDLE_POLL_S = 0.05


class WarmupCancelled(BaseException):
    """Raised into the warmup (through its progress callback) when the server stops.

    A BaseException, like asyncio.CancelledError: the plan's `except Exception` records a
    failed phase with a traceback, and a stop is neither a failure nor worth a traceback.
    """


class RunnerWorker:
    def __init__(self, tracker: StatusTracker) -> None:
        self._tracker = tracker
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warmgate-runner")
        self._lock = asyncio.Lock()
        # Checked by the worker between steps; a Python thread cannot be interrupted otherwise.
        self._cancel = threading.Event()
        # Set by the worker thread while it runs a job, which close() cannot interrupt.
        self._busy = threading.Event()
        self._closing = False
        self._jobs_waiting = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> None:
        """Remember the running event loop: the worker hands progress back to it."""
        self._loop = asyncio.get_running_loop()

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def cancelled(self) -> bool:
        """Set once the server stops: a run that ends after it is not reported."""
        return self._cancel.is_set()

    @property
    def jobs_waiting(self) -> int:
        """Runner jobs (load, warmups) queued behind the lock; read from the worker thread,
        where the serving loop yields to them at its next step."""
        return self._jobs_waiting

    def stop_taking_work(self) -> None:
        """Refuse new jobs, and stop the running one at its next step."""
        self._closing = True
        self._cancel.set()

    def check_open(self) -> None:
        if self._closing:
            raise ShuttingDown()

    @contextlib.asynccontextmanager
    async def job(self) -> AsyncIterator[None]:
        """One runner job: counted as in flight while queued, run alone under the lock."""
        self._tracker.job_queued()
        self._jobs_waiting += 1
        waiting = True
        try:
            async with self._lock:
                self._jobs_waiting -= 1
                waiting = False
                self.check_open()
                yield
        finally:
            if waiting:  # cancelled before it got the lock
                self._jobs_waiting -= 1
            self._tracker.job_done()

    async def run_between_jobs(self, fn: Callable[[], None],
                               start: Callable[[], None] | None = None) -> None:
        """fn (the serving loop) on the worker, between runner jobs; jobs queued meanwhile
        go first once fn returns (asyncio.Lock wakes waiters in order). `start` runs here on
        the event loop once the runner is ours, before fn is handed to the worker thread."""
        async with self._lock:
            self.check_open()
            if start is not None:
                start()
            await self.run(fn)

    async def run(self, fn: Callable[[], T]) -> T:
        """fn on the worker thread; the caller holds the lock (job or run_between_jobs)."""
        if self._loop is None:
            raise RuntimeError("RunnerWorker.bind() was not called")
        busy = self._busy

        def tracked() -> T:
            busy.set()
            try:
                return fn()
            finally:
                busy.clear()

        return await self._loop.run_in_executor(self._executor, tracked)

    def progress_to(self, sink: Callable[[ProgressEvent], None]) -> ProgressCallback:
        """A progress callback for the worker thread: raises WarmupCancelled once the server
        stops, else hands each event to `sink` on the event loop."""
        def progress(event: ProgressEvent) -> None:
            if self._cancel.is_set():
                raise WarmupCancelled("the server is shutting down")
            self.call_soon(sink, event)

        return progress

    def call_soon(self, fn: Callable[[T], None], arg: T) -> None:
        """fn(arg) on the event loop, from any thread."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed under us: nobody listens
                loop.call_soon_threadsafe(fn, arg)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the worker to finish its step; False if it did not."""
        deadline = time.monotonic() + timeout
        while self._busy.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(IDLE_POLL_S)
        return not self._busy.is_set()

    async def shutdown(self, *, wait: bool) -> None:
        """Stop the thread; with `wait` (tests), return once it has ended."""
        if wait:
            await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        else:
            self._executor.shutdown(wait=False, cancel_futures=True)
