"""The process group every rank joins: NCCL on CUDA (each rank its own GPU), gloo on the CPU.

Rank 0 opens the rendezvous store on a free loopback port before it starts the workers, so
the port it hands them is one it already holds. Every collective times out after
COLLECTIVE_TIMEOUT_S: a rank that hangs turns into an error on the others, never a hang.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.runner.shard_layout import ShardLayout
from warmgate.server.runner.tensor_parallel import TensorParallel

logger = logging.getLogger(__name__)

# Longer than any single step on any rank (a first Triton compile in a prefill included),
# short enough that a hung peer ends the pod well inside a startupProbe's budget.
COLLECTIVE_TIMEOUT_S = 120.0
STORE_HOST = "127.0.0.1"


def open_store(world_size: int) -> Any:
    """Rank 0's rendezvous store on a free port (store.port)."""
    return dist.TCPStore(STORE_HOST, 0, world_size, is_master=True,
                         timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                         wait_for_workers=False)


def join_store(port: int, world_size: int) -> Any:
    return dist.TCPStore(STORE_HOST, port, world_size, is_master=False,
                         timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))


def rank_config(config: RunnerConfig, rank: int) -> RunnerConfig:
    """Rank `rank`'s copy of the resolved config: its rank, and on CUDA its own GPU."""
    device = config.device.device
    if device.startswith("cuda"):
        base = int(device.partition(":")[2] or 0)
        device = f"cuda:{base + rank}"
    return dataclasses.replace(
        config, parallel=dataclasses.replace(config.parallel, rank=rank),
        device=dataclasses.replace(config.device, device=device))


def backend_for(config: RunnerConfig) -> str:
    return "nccl" if config.device.device.startswith("cuda") else "gloo"


def join_group(config: RunnerConfig, store: Any) -> TensorParallel:
    """Join the world group for config.parallel's rank; returns the model's communicator.

    On CUDA `device_id` makes NCCL create its communicator now rather than at the first
    collective (the post-ready stall this project removes); the distributed warmup phase
    then runs every collective the model uses."""
    rank, size = config.parallel.rank, config.parallel.tensor_parallel_size
    backend = backend_for(config)
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        device = torch.device(config.device.device)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S), **kwargs)
    # Python objects (per-rank timings) travel on a gloo group whatever the device.
    object_group = dist.new_group(backend="gloo") if backend == "nccl" else None
    logger.info("rank %d/%d joined the %s process group", rank, size, backend)
    tp = TensorParallel(ShardLayout.of(config.model, rank, size))
    tp.object_group = object_group
    return tp
