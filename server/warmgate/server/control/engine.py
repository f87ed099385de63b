"""The blocking runner work the controller hands to its worker thread.

`WarmupEngine` is the seam between the asyncio side (controller, RPCs) and the model: its
load and warmup methods block for as long as the GPU/CPU work takes and are only ever called
from the one worker thread. `PlanEngine` drives the real runner through the warmup plan;
tests can pass a fake with the same methods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from warmgate.server.cache.session import open_compile_cache, run_plan_with_cache
from warmgate.server.cache.store import CompileCache
from warmgate.server.config.attention_backends import ATTENTION_BACKENDS
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.control.background_startup import import_in_background
from warmgate.server.control.faults import FaultInjector
from warmgate.server.core.failures import (
    FatalDeviceError,
    describe_failure,
    is_fatal_device_error,
    is_out_of_memory,
)
from warmgate.server.core.phases import LOAD, MIXED_PHASES
from warmgate.server.core.progress import ProgressCallback
from warmgate.server.core.results import PhaseResult, PhaseStatus, WarmupReport
from warmgate.server.jit import JitMonitor
from warmgate.server.telemetry.report_log import log_phase
from warmgate.server.text.model_text import ModelText

if TYPE_CHECKING:  # warmup's package imports the torch-heavy plan; the checker only needs this
    from warmgate.server.control.remote_serving import RemoteRunner
    from warmgate.server.warmup.runner_contract import WarmupRunner

logger = logging.getLogger(__name__)



class WarmupEngine(Protocol):
    """What the controller needs from the model side; every method but the properties
    blocks and runs on the worker thread."""

    @property
    def loaded(self) -> bool: ...

    @property
    def runner(self) -> WarmupRunner | RemoteRunner | None:
        """The runner the serving loop drives once loaded (in the engine process: the handle
        that builds that process's loop); None before, or when the engine has none (a test
        fake that only plays warmups)."""

    @property
    def jit_monitor(self) -> JitMonitor | None:
        """Counts the runner's compiles (None: nothing to count, as in a test fake)."""

    def compile_cache_info(self) -> dict[str, Any] | None:
        """The --cache-dir entry for GetStatus (None without one); cheap, called per status."""

    def load(self) -> PhaseResult:
        """Build the runner; a failure comes back as a FAILED phase.

        The one exception is a fatal device error (FatalDeviceError): no phase result can
        describe a process that has to exit.
        """

    def run_plan(self, *, mixed_num_tokens: int | None, force: bool,
                 progress: ProgressCallback) -> WarmupReport:
        """Every phase after load; the first plan after load reports the load phase too.

        Phase failures are in the report; only a FatalDeviceError is raised.
        """

    def run_mixed(self, num_tokens: int, *, progress: ProgressCallback) -> WarmupReport: ...


class PlanEngine:
    """The real runner, driven through warmgate.server.warmup.plan.

    `faults` (tests only) makes chosen phases raise or stall; see warmgate.server.config.faults.
    """

    def __init__(self, config: RunnerConfig, *, faults: FaultInjector | None = None,
                 cache: CompileCache | None = None, text: ModelText | None = None) -> None:
        self._config = config
        self._faults = faults
        # The tokenizer and EOS ids the server loaded at start-up, for the structured phase
        # (None: that phase reads the model directory itself).
        self._text = text
        # The --cache-dir entry: opened before the runner is built, marked READY after the
        # first successful plan (warmgate.server.cache.store has the protocol).
        self._cache = cache
        # Counts the runner's JIT compiles; the controller marks it ready and listens to it.
        self.jit_monitor = JitMonitor()
        self._runner: WarmupRunner | None = None
        # Reported once, at the head of the first plan's report, then dropped.
        self._load_phase: PhaseResult | None = None
        # Told (from another thread) when the runner can never run again although no step
        # raised: a tensor-parallel worker process died. The server sets it (app.py).
        self.on_fatal: Callable[[FatalDeviceError], None] | None = None

    @property
    def loaded(self) -> bool:
        return self._runner is not None

    @property
    def runner(self) -> WarmupRunner | None:
        """The ModelRunner once loaded (None before): the serving loop drives it, on the
        same worker thread as everything else here."""
        return self._runner

    def load(self) -> PhaseResult:
        from warmgate.server.warmup import plan  # lazy: imports torch and the runner

        start = time.perf_counter()
        try:
            if self._faults is not None:
                self._faults.enter(LOAD)
            open_compile_cache(self._cache, self._config)  # before anything reads the env
            backend = ATTENTION_BACKENDS.get(self._config.device.attention_backend)
            if backend is not None:  # "auto" is resolved by now; a test's config may not be
                import_in_background(backend.library)
            self._runner, phase = plan.load_runner(self._config, jit_monitor=self.jit_monitor)
            if self._faults is not None:
                self._faults.wrap_runner(self._runner)
            workers = getattr(self._runner, "workers", None)  # tensor parallel only
            if workers is not None and self.on_fatal is not None:
                on_fatal = self.on_fatal
                workers.watch(lambda exc: on_fatal(FatalDeviceError("distributed", exc)))
        except Exception as exc:  # a load failure is reported and turns health FAILED
            if is_fatal_device_error(exc):
                raise FatalDeviceError(LOAD, exc) from exc
            if not is_out_of_memory(exc):  # a settings problem: the phase line says it all
                logger.exception("loading the model failed")
            phase = PhaseResult(name=LOAD, status=PhaseStatus.FAILED,
                                duration_s=time.perf_counter() - start,
                                detail=describe_failure(LOAD, exc))
            log_phase(phase)
        self._load_phase = phase
        return phase

    def run_plan(self, *, mixed_num_tokens: int | None, force: bool,
                 progress: ProgressCallback) -> WarmupReport:
        from warmgate.server.warmup import plan

        load_phase, self._load_phase = self._load_phase, None
        if self._faults is not None:
            self._faults.start_run()
            progress = self._faults.watching(progress)
        runner = self._loaded_runner()
        return run_plan_with_cache(self._cache, lambda: plan.run_warmup_plan(
            runner, load_phase=load_phase, mixed_num_tokens=mixed_num_tokens,
            progress=progress, force=force, text=self._text))

    def compile_cache_info(self) -> dict[str, Any] | None:
        """The entry's state, key, directory and size (refreshed at most every few seconds)."""
        return self._cache.refresh_size().to_dict() if self._cache is not None else None

    def run_mixed(self, num_tokens: int, *, progress: ProgressCallback) -> WarmupReport:
        from warmgate.server.warmup import plan

        if self._faults is not None:
            self._faults.start_run(MIXED_PHASES)
            progress = self._faults.watching(progress)
        return plan.run_mixed_warmup(self._loaded_runner(), num_tokens, progress=progress)

    def _loaded_runner(self) -> WarmupRunner:
        if self._runner is None:  # the controller runs warmups only once loaded
            raise RuntimeError("PlanEngine: a warmup ran before the model was loaded")
        return self._runner
