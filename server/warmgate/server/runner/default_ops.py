"""The ops object a runner's model calls, from its configuration."""

from __future__ import annotations

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.runner.deterministic_ops import RowwiseTorchOps
from warmgate.server.runner.ops import TorchOps


def default_ops(config: RunnerConfig) -> TorchOps:
    """Triton kernels for norms, activation and rotary on CUDA when a GPU backend is in use;
    torch everywhere else (the CPU path never imports triton). --deterministic: their
    batch-invariant forms (runner.deterministic_ops, kernels.invariant_ops)."""
    deterministic = config.numerics.deterministic
    if config.device.device.startswith("cuda") and config.device.attention_backend != "torch":
        from warmgate.server.kernels.invariant_ops import BatchInvariantOps
        from warmgate.server.kernels.ops import TritonOps
        from warmgate.server.kernels.triton_key import start_triton_key

        start_triton_key()  # Triton's cache key, hashed while the weights load
        # Same methods as TorchOps.
        return BatchInvariantOps() if deterministic else TritonOps()  # type: ignore[return-value]
    return RowwiseTorchOps() if deterministic else TorchOps()
