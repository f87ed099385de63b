"""The dense-GEMM sweep on a thread and a CUDA stream of its own, beside the sampler rows.

The compile phase's two sweeps are independent: the GEMMs read the weights, the sampler rows
random logits. Most of a GEMM call's cost on a warm start is host work inside cuBLAS (choosing
the algorithm for a new shape, loading the kernel at its first launch), which torch runs
without the GIL, and what it leaves behind (the loaded kernels, the chosen algorithms) serves
every thread: bench/kernel_map_touch.py's `thread` policy measures a first call on the
runner's thread after a sweep on another one, and finds it as cheap as after a sweep on the
same thread (bench/results/README.md). So the GEMMs run on their own thread while the
sampler rows run on the caller's, and the phase waits for both.

Not while the sampler rows learn their kernel map: the probe profiles every kernel the
process launches, and the GEMMs would land in the sampler's map.
"""

from __future__ import annotations

import threading

import torch

from warmgate.server.warmup.gemm_shapes import sweep_gemm_shapes
from warmgate.server.warmup.runner_contract import WarmupRunner


class GemmSweepThread:
    """sweep_gemm_shapes(model_runner), started at construction; `result` waits for it and
    returns its count or raises what it raised."""

    def __init__(self, model_runner: WarmupRunner) -> None:
        self._runner = model_runner
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
                    self._runner, where="on a thread of its own, beside the sampler rows")
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
