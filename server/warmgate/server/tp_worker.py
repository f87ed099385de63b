"""A worker rank: `python -m warmgate.server.tp_worker --rank R --store-port P --reply-fd F`,
started by rank 0 (distributed/workers.py), never by hand.

A program at the top of the house, beside main.py: it runs the warmup's dense-GEMM sweep for
rank 0 (warmup/gemm_shapes.py), and the warmup plan builds the tensor-parallel runner
(distributed/build.py), so inside distributed/ it would close a cycle.

It installs the same JIT observers as rank 0 and sends every event they (and the runner: a
CUDA-graph miss, a communicator set-up) record to rank 0 over the pipe F (replies.py).

It reads its config from stdin, joins the process group, loads its shard, then runs each call
rank 0 sends until stdin ends (rank 0 stopped or died) or its parent changes (rank 0 died
while this rank sat in a collective); then it exits. Any error ends the process non-zero,
which rank 0's watchdog reports.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

import torch

from warmgate.server.control.heap_freeze import (
    FREEZE_PROGRAM,
    THAW_PROGRAM,
    freeze_warm_heap,
    thaw_warm_heap,
)
from warmgate.server.distributed.channel import receive
from warmgate.server.distributed.process_group import join_group, join_store
from warmgate.server.distributed.replies import ReplySender
from warmgate.server.jit import JitMonitor
from warmgate.server.jit.install import install_observers

logger = logging.getLogger(__name__)

PARENT_POLL_S = 1.0


def exit_with_parent() -> None:
    """Exit as soon as rank 0 is gone, even from inside a collective that would only time
    out later (the process is re-parented, so getppid changes)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warmgate.server.tp_worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--reply-fd", type=int, default=None,
                        help="the pipe this rank's JIT events go to rank 0 on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s "
                                                   f"[rank {args.rank}] %(name)s: %(message)s")
    exit_with_parent()
    stdin = sys.stdin.buffer
    config = receive(stdin)
    if config is None:
        return 0  # rank 0 went away before it sent anything
    size = config.parallel.tensor_parallel_size
    if config.device.device == "cpu":  # the host's cores, shared between the ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    from warmgate.server.distributed.runners import WorkerRunner  # after threads are set

    monitor = JitMonitor(rank=args.rank)
    sender = None
    if args.reply_fd is not None:
        sender = ReplySender(os.fdopen(args.reply_fd, "wb"))
        monitor.add_listener(sender)
    install_observers(monitor, config)  # before the load, as rank 0 does (plan.load_runner)
    tp = join_group(config, join_store(args.store_port, size))
    from warmgate.server.warmup.gemm_shapes import sweep_gemm_shapes

    runner = WorkerRunner(config, tensor_parallel=tp, jit_monitor=monitor)
    rank = f"rank {args.rank}"
    # The heap programs: rank 0 sends them after a successful warmup (before its readiness
    # turns SERVING) and before the next one (control/heap_freeze.py).
    runner.programs = {"sweep_gemm_shapes": sweep_gemm_shapes,
                       FREEZE_PROGRAM: lambda _runner: freeze_warm_heap(rank),
                       THAW_PROGRAM: lambda _runner: thaw_warm_heap()}
    logger.info("rank %d/%d loaded: %s", args.rank, size, runner.load_stats)
    while (message := receive(stdin)) is not None:
        runner.handle(*message)
    logger.info("rank %d: rank 0 closed the channel; exiting", args.rank)
    monitor.close()
    if sender is not None:
        sender.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
