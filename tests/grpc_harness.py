"""Real in-process grpc.aio servers for the gRPC and CLI tests (grpcio-testing cannot run aio).

`serving()` runs a server inside the test's own event loop (for the aio client);
`ServerThread` runs one on a loop in a background thread, for the sync client and the CLI,
whose blocking calls would otherwise stall the loop the server needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from warmgate.server.app import RunningServer, create_server
from warmgate.server.config.server_config import ServerConfig
from warmgate.server.control.engine import PlanEngine, WarmupEngine
from warmgate.server.core.phases import PLAN_PHASES
from warmgate.server.core.progress import ProgressCallback, ProgressEvent
from warmgate.server.core.results import (
    PhaseResult,
    PhaseStatus,
    SkipReason,
    WarmupOutcome,
    WarmupReport,
)
from warmgate.server.startup import load_server_config

T = TypeVar("T")
TEST_TIMEOUT_S = 30.0


def server_config(*flags: str) -> ServerConfig:
    """The tiny model on CPU, loopback, free ports, no warmup on start unless flags say so;
    the runner in this process unless they pass --engine-process (a second process costs
    seconds of torch import per server)."""
    process = [] if "--engine-process" in flags else ["--no-engine-process"]
    return load_server_config(["--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                               "--device", "cpu", "--no-warmup-on-start", *process, *flags],
                              environ={})


def run(coro: Awaitable[T], timeout: float = TEST_TIMEOUT_S) -> T:
    """asyncio.run with a bound, so a hang fails the test instead of the whole run."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


async def eventually(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def grammar_probes_idle(running: RunningServer, count: int = 2) -> None:
    """Every grammar compile probe started. Their zygote imports xgrammar (seconds on a
    loaded machine) from the first warmup on when the server does not warm up on start, and
    a grammar request's budget counts the wait for a probe."""
    await eventually(lambda: running.generation.grammar_probes_idle >= count, 120)


class CountingPlanEngine(PlanEngine):
    """The real runner and plan, counting how often the plan ran."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan_runs = 0

    def run_plan(self, **kwargs: Any) -> WarmupReport:
        self.plan_runs += 1
        return super().run_plan(**kwargs)


class FakeEngine:
    """Steps through named phases with optional delays, a gate and failures; counts runs.

    Used where a test needs what the tiny real model cannot give on demand: a failure, a run
    held open while callers pile up, or a load that breaks.
    """

    def __init__(self, *, phases: Sequence[str] = PLAN_PHASES[1:], steps: int = 2,
                 step_s: float = 0.0, fail_phase: str | None = None, load_fails: bool = False,
                 gate: threading.Event | None = None) -> None:
        self.phases, self.steps, self.step_s = tuple(phases), steps, step_s
        self.fail_phase, self.load_fails, self.gate = fail_phase, load_fails, gate
        self.plan_runs = self.mixed_runs = 0
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    # No runner to serve, no compiles to count, no --cache-dir entry: warmups only.
    runner = None
    jit_monitor = None

    def compile_cache_info(self) -> None:
        return None

    def load(self) -> PhaseResult:
        if self.load_fails:
            return PhaseResult("load", PhaseStatus.FAILED, detail="weights not found")
        self._loaded = True
        return PhaseResult("load", PhaseStatus.RAN, duration_s=0.001)

    def run_plan(self, *, mixed_num_tokens: int | None, force: bool,
                 progress: ProgressCallback) -> WarmupReport:
        self.plan_runs += 1
        if self.gate is not None:
            self.gate.wait(TEST_TIMEOUT_S)
        phases = [self._phase(name, i, progress) for i, name in enumerate(self.phases, 1)]
        return _report(phases)

    def run_mixed(self, num_tokens: int, *, progress: ProgressCallback) -> WarmupReport:
        self.mixed_runs += 1
        if num_tokens < 3:
            return _report([PhaseResult.skipped("mixed", SkipReason.NUM_TOKENS_LT_3, "< 3")])
        return _report([self._phase("mixed", 0, progress)])

    def _phase(self, name: str, index: int, progress: ProgressCallback) -> PhaseResult:
        start = time.perf_counter()
        for step in range(1, self.steps + 1):
            time.sleep(self.step_s)
            progress(ProgressEvent(name, step, self.steps, index, len(self.phases) + 1))
        status = PhaseStatus.FAILED if name == self.fail_phase else PhaseStatus.RAN
        return PhaseResult(name, status, duration_s=time.perf_counter() - start,
                           num_steps=self.steps, detail="boom" if status is PhaseStatus.FAILED
                           else "ran", shapes={"num_reqs": 2, "sizes": [1, 2]})


def _report(phases: list[PhaseResult]) -> WarmupReport:
    failed = any(p.status is PhaseStatus.FAILED for p in phases)
    return WarmupReport(WarmupOutcome.FAILED if failed else WarmupOutcome.SUCCEEDED, phases,
                        sum(p.duration_s for p in phases), "fakehash", device="cpu",
                        attention_backend="torch", model="fake")


@contextlib.contextmanager
def startup_objects_frozen() -> Iterator[None]:
    """While a server runs here, what existed before it started is frozen, as main freezes
    what its imports built (control/import_collection.py): the heap freeze after the first
    warmup then collects what the server built, as in a process of its own, instead of
    walking the whole test process (0.2 s a server). A forced warmup hands every freeze back
    first, as it does there; after the server, nothing stays frozen."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.asynccontextmanager
async def serving(config: ServerConfig | None = None, engine: WarmupEngine | None = None
                  ) -> AsyncIterator[RunningServer]:
    with startup_objects_frozen():
        running = await create_server(config or server_config(), engine=engine)
        try:
            yield running
        finally:
            await running.stop(0, wait_for_runner=True)


class ServerThread:
    """A server on its own loop and thread; `target` is what a sync client dials."""

    def __init__(self, config: ServerConfig | None = None,
                 engine: WarmupEngine | None = None) -> None:
        self._config = config or server_config()
        self._engine = engine
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.running: RunningServer

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(TEST_TIMEOUT_S)

    def __enter__(self) -> ServerThread:
        with contextlib.ExitStack() as stack:  # a failed start unfreezes at once
            stack.enter_context(startup_objects_frozen())
            self._thread.start()
            self.running = self.call(create_server(self._config, engine=self._engine))
            self._unfreeze = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self.running.stop(0, wait_for_runner=True))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(TEST_TIMEOUT_S)
            self._loop.close()
            self._unfreeze.close()


@contextlib.contextmanager
def warmed_server_thread(config: ServerConfig) -> Iterator[ServerThread]:
    """A ServerThread whose warmup has run (a WarmupKernels call), as a fixture yields it."""
    from warmgate.client.aio import AsyncWarmgateClient

    async def warm(target: str) -> None:
        async with AsyncWarmgateClient(target) as client:
            await client.warmup_kernels()

    with ServerThread(config) as thread:
        run(warm(thread.target), 120)
        yield thread
