"""Which observers a runner configuration needs; imports nothing it does not need."""

from __future__ import annotations

import importlib.util

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.jit.monitor import JitMonitor, Observer


def observers_for(config: RunnerConfig) -> list[Observer]:
    """Dynamo when torch.compile is on; Triton where our kernels (or inductor's) compile,
    i.e. on CUDA or with the triton backend; FlashInfer when that backend is in use. The CPU
    torch path imports neither triton nor flashinfer."""
    observers: list[Observer] = []
    on_cuda = config.device.device.startswith("cuda")
    backend = config.device.attention_backend
    if config.compilation.compile:
        from warmgate.server.jit.dynamo_observer import DynamoObserver

        observers.append(DynamoObserver())
    if (on_cuda or backend == "triton") and importlib.util.find_spec("triton") is not None:
        from warmgate.server.jit.triton_observer import TritonObserver

        observers.append(TritonObserver())
    if backend == "flashinfer":
        from warmgate.server.jit.flashinfer_observer import FlashInferObserver

        observers.append(FlashInferObserver())
    return observers


def install_observers(monitor: JitMonitor, config: RunnerConfig) -> list[str]:
    return monitor.install(observers_for(config))
