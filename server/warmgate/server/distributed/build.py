"""Build rank 0's tensor-parallel runner: start the workers, join the group, load the shard."""

from __future__ import annotations

import logging

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.distributed.process_group import join_group, open_store, rank_config
from warmgate.server.distributed.runners import TensorParallelRunner
from warmgate.server.distributed.workers import WorkerGroup
from warmgate.server.jit import JitMonitor

logger = logging.getLogger(__name__)


def build_tensor_parallel_runner(config: RunnerConfig,
                                 jit_monitor: JitMonitor | None = None) -> TensorParallelRunner:
    """`config` resolved, tensor_parallel_size > 1. Every rank loads its shard at once; this
    returns when rank 0 has (the workers' loads end before the first collective completes)."""
    size = config.parallel.tensor_parallel_size
    store = open_store(size)
    workers = WorkerGroup.start([rank_config(config, r) for r in range(1, size)], store.port)
    try:
        tp = join_group(rank_config(config, 0), store)
        runner = TensorParallelRunner(rank_config(config, 0), workers, tp, jit_monitor)
    except BaseException:
        workers.close()
        raise
    runner.store = store  # the rendezvous store lives as long as the group
    return runner
