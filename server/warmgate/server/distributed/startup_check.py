"""Start-up checks for --tensor-parallel-size: a configuration that can never run is refused
before anything starts, one line naming the flag."""

from __future__ import annotations

from warmgate.server.config.runner_config import ConfigError, RunnerConfig
from warmgate.server.runner.shard_layout import TP_FIELD, check_divisible


def check_tensor_parallel(config: RunnerConfig, cuda_device_count: int | None = None) -> None:
    """config resolved. ConfigError (field parallel.tensor_parallel_size) when the model does
    not split N ways, when --compile is on (the all-reduce inside a compiled graph is not
    supported yet) or when the host has fewer GPUs than ranks."""
    size = config.parallel.tensor_parallel_size
    if size == 1:
        return
    check_divisible(config.model, size)
    if config.compilation.compile:
        raise ConfigError(TP_FIELD, f"{size} ranks with --compile: torch.compile of the "
                                    "sharded layers is not supported; turn --compile off")
    device = config.device.device
    if device.startswith("cuda"):
        if cuda_device_count is None:
            import torch

            cuda_device_count = torch.cuda.device_count()
        first = int(device.partition(":")[2] or 0)
        if first + size > cuda_device_count:
            raise ConfigError(TP_FIELD, f"{size} ranks need GPUs {first}..{first + size - 1}, "
                                        f"this host has {cuda_device_count}")
