"""The dense-GEMM sweep on a thread and a CUDA stream of its own, beside the sampler rows.

The compile phase's two sweeps are independent: the GEMMs read the weights, the sampler rows
random logits, and the phases after it (the kernel warmups, structured output, the mixed
batch) need neither to have ended. Most of a GEMM call's cost on a warm start is host work
inside cuBLAS (choosing the algorithm for a new shape, loading the kernel at its first
launch), which torch runs without the GIL, and what it leaves behind (the loaded kernels, the
chosen algorithms) serves every thread: bench/warm.py kernel-map-touch's `thread` policy measures a
first call on the runner's thread after a sweep on another one, and finds it nearly as cheap as
after a sweep on the same thread, against a hundredfold more with no sweep
(bench/results/README.md). So the GEMMs run on their own thread
while the sampler rows run on the caller's, and the plan goes on to the next phases; it waits
for the GEMMs before the CUDA graphs (a capture must have the process to itself) and fails the
plan there if they failed (finish_gemm_sweeps), so nothing is ready with a sweep unfinished.

Not while the sampler rows learn their kernel map: the probe profiles every kernel the process
launches, and the GEMMs would land in the sampler's map.

The sweep needs only the weights' tensors, not their values: cuBLAS chooses by shape, dtype
and layout. So on a start-up it begins as soon as the model's tensors exist, before the weights
are read into them (`start_with_model`, the runner's `on_model_built`), and runs beside the
load, the FlashInfer phase and the sampler rows; the plan takes it over (`take_started`).
Its GEMMs read tensors the load is writing on other streams, and their outputs are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

import torch

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.warmup.gemm_shapes import GemmPlan, sweep_gemm_shapes
from warmgate.server.warmup.runner_contract import WarmupRunner

logger = logging.getLogger(__name__)


BESIDE_THE_PHASES = ("on a thread of its own, beside the sampler rows and the phases after "
                     "them")
WITH_THE_MODEL = ("on a thread of its own from the model's construction on, beside the "
                  "weights' load and the phases after it")


class GemmSweepThread:
    """sweep_gemm_shapes(model_runner) over `plan` (gemm_plan's), started at construction;
    `result` waits for it and returns its count or raises what it raised."""

    def __init__(self, model_runner: WarmupRunner, plan: GemmPlan, *,
                 where: str = BESIDE_THE_PHASES) -> None:
        self._runner: WarmupRunner | None = model_runner
        self._plan = plan
        self._where = where
        # The GEMMs it will run, for a phase that reports them before they have run.
        self.planned = sum(len(ms) for _, ms in plan)
        self._count = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="warmgate-gemm-sweep",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        runner, plan = self._runner, self._plan
        assert runner is not None  # set until this ends
        try:
            # A stream of its own: the caller's synchronizations do not wait for the GEMMs.
            stream = (torch.cuda.Stream(runner.device)  # type: ignore[no-untyped-call]
                      if runner.device.type == "cuda" else None)
            with torch.cuda.stream(stream):  # None: the CPU's one stream
                self._count = sweep_gemm_shapes(runner, plan=plan, where=self._where)
            if stream is not None:
                stream.synchronize()
        except BaseException as exc:  # handed to the phase's thread by result()
            self._error = exc
        finally:  # a sweep nobody takes over must not keep the runner or its weights alive
            self._runner, self._plan = None, []

    def wait(self) -> None:
        """Until the sweep has ended, whatever its outcome."""
        self._thread.join()

    def result(self) -> int:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._count


def finish_gemm_sweeps(threads: list[GemmSweepThread]) -> float | None:
    """Before the CUDA graphs: wait for the sweeps the compile phase left running (a capture
    must not share the process with them) and raise what one raised; empties the list.
    Returns the seconds waited (None: there was nothing to wait for)."""
    if not threads:
        return None
    start = time.perf_counter()
    pending = list(threads)
    threads.clear()
    try:
        for thread in pending:
            thread.result()
    finally:
        for thread in pending:
            thread.wait()
    waited = time.perf_counter() - start
    logger.info("shape sweeps: waited %.3f s for the dense GEMMs before the CUDA graphs",
                waited)
    return waited


def abandon_gemm_sweeps(threads: list[GemmSweepThread]) -> None:
    """After a plan that did not reach the CUDA graphs: wait for them, whatever they raise
    (the plan's own failure is the one reported); empties the list."""
    for thread in threads:
        thread.wait()
    threads.clear()


# The sweep each runner's construction started, until its plan takes it (keyed by id: a
# finalizer drops the entry of a runner that is never warmed up).
_started: dict[int, GemmSweepThread] = {}


def starts_with_model(config: RunnerConfig) -> bool:
    """Whether a start-up's GEMM sweep begins with the model (start_with_model): on CUDA with
    the shape sweeps on, one GPU, and torch.compile off (its compile phase runs the forward at
    its buckets first, and a torch.compile run is minutes long anyway)."""
    return (config.device.device.startswith("cuda") and config.compilation.shape_sweeps
            and not config.compilation.compile
            and config.parallel.tensor_parallel_size == 1)


def start_with_model(model_runner: WarmupRunner) -> GemmSweepThread:
    """The runner's `on_model_built`: start the sweep over its gemm_plan now, for its
    warmup plan to take over (take_started)."""
    from warmgate.server.warmup.gemm_shapes import gemm_plan

    thread = GemmSweepThread(model_runner, gemm_plan(model_runner), where=WITH_THE_MODEL)
    key = id(model_runner)
    _started[key] = thread
    weakref.finalize(model_runner, _started.pop, key, None)
    logger.info("shape sweeps: dense GEMMs: %d started with the model, before its weights are "
                "read", thread.planned)
    return thread


def take_started(model_runner: WarmupRunner) -> list[GemmSweepThread]:
    """The sweep the runner's construction started ([] if none, or already taken)."""
    thread = _started.pop(id(model_runner), None)
    return [] if thread is None else [thread]
