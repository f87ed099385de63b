"""The dense-GEMM sweep on a thread and a CUDA stream of its own, beside the sampler rows.

The compile phase's two sweeps are independent: the GEMMs read the weights, the sampler rows
random logits, and the phases after it (the kernel warmups, structured output, the mixed
batch) need neither to have ended. Most of a GEMM call's cost on a warm start is host work
inside cuBLAS (choosing the algorithm for a new shape, loading the kernel at its first
launch), which torch runs without the GIL, and what it leaves behind (the loaded kernels, the
chosen algorithms) serves every thread: bench/kernel_map_touch.py's `thread` policy measures a
first call on the runner's thread after a sweep on another one, and finds it nearly as cheap as
after a sweep on the same thread, against a hundredfold more with no sweep
(bench/results/README.md). So the GEMMs run on their own thread
while the sampler rows run on the caller's, and the plan goes on to the next phases; it waits
for the GEMMs before the CUDA graphs (a capture must have the process to itself) and fails the
plan there if they failed (finish_gemm_sweeps), so nothing is ready with a sweep unfinished.

Not while the sampler rows learn their kernel map: the probe profiles every kernel the process
launches, and the GEMMs would land in the sampler's map.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from warmgate.server.warmup.gemm_shapes import GemmPlan, sweep_gemm_shapes
from warmgate.server.warmup.runner_contract import WarmupRunner

logger = logging.getLogger(__name__)


class GemmSweepThread:
    """sweep_gemm_shapes(model_runner) over `plan` (gemm_plan's), started at construction;
    `result` waits for it and returns its count or raises what it raised."""

    def __init__(self, model_runner: WarmupRunner, plan: GemmPlan) -> None:
        self._runner = model_runner
        self._plan = plan
        # The GEMMs it will run, for a phase that reports them before they have run.
        self.planned = sum(len(ms) for _, ms in plan)
        self._count = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="warmgate-gemm-sweep",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            # A stream of its own: the caller's synchronizations do not wait for the GEMMs.
            device = self._runner.device
            stream = (torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
                      if device.type == "cuda" else None)
            with torch.cuda.stream(stream):  # None: the CPU's one stream
                self._count = sweep_gemm_shapes(
                    self._runner, plan=self._plan,
                    where="on a thread of its own, beside the sampler rows and the phases "
                          "after them")
            if stream is not None:
                stream.synchronize()
        except BaseException as exc:  # handed to the phase's thread by result()
            self._error = exc

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
