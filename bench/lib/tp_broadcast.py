"""What it costs per decode step to send the step's metadata from rank 0 to the workers.

Two ways, each over N-1 real worker processes, for a decode step of B requests (the
SchedulerOutput and the previous step's sampled tokens, exactly the message
warmgate.server.distributed sends):
  pipe: the channel the server uses (pickle once, write into each worker's stdin pipe);
  gloo: torch.distributed.broadcast_object_list on a gloo group (the alternative).
Each step is timed on rank 0 until every worker has decoded the message and acknowledged it
(a round trip, so it bounds the latency a worker adds before its forward starts); `send` is
rank 0's own cost (pickle and write) alone. Prints microseconds per decode step.

    python bench/serve.py tp-broadcast [--ranks 2] [--requests 64] [--steps 2000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import timedelta
from statistics import median
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from warmgate.server.distributed.channel import encode, receive, send_encoded
from warmgate.server.runner.scheduler_output import CachedRequestData, SchedulerOutput


def decode_message(num_reqs: int, step: int) -> tuple[str, tuple[Any, ...], dict[str, list[int]]]:
    ids = [f"req-{i:05d}" for i in range(num_reqs)]
    cached = CachedRequestData(req_ids=ids, new_block_ids=[None] * num_reqs,
                               num_computed_tokens=[100 + step] * num_reqs)
    so = SchedulerOutput(scheduled_cached_reqs=cached, num_scheduled_tokens=dict.fromkeys(ids, 1),
                         total_num_scheduled_tokens=num_reqs)
    return "execute_model", (so,), {r: [step % 50000] for r in ids}


def _child() -> None:
    """A pipe worker: read each message, acknowledge it with one byte."""
    while receive(sys.stdin.buffer) is not None:
        sys.stdout.buffer.write(b"k")
        sys.stdout.buffer.flush()


def bench_pipe(ranks: int, num_reqs: int, steps: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    children = [subprocess.Popen([sys.executable, "-m", "bench.tp_broadcast", "--child"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                for _ in range(ranks - 1)]
    round_trips, sends = [], []
    for step in range(steps):
        message = decode_message(num_reqs, step)  # the scheduler's work, not the channel's
        start = time.perf_counter()
        data = encode(message)
        for c in children:
            send_encoded(c.stdin, data)  # type: ignore[arg-type]
        sent = time.perf_counter()
        for c in children:
            c.stdout.read(1)  # type: ignore[union-attr]
        round_trips.append(time.perf_counter() - start)
        sends.append(sent - start)
    for c in children:
        c.stdin.close()  # type: ignore[union-attr]
        c.wait()
    return {"round_trip_us": 1e6 * median(round_trips), "send_us": 1e6 * median(sends),
            "bytes": len(data)}


def _gloo_rank(rank: int, ranks: int, port: int, num_reqs: int, steps: int,
               out: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks, timeout=timedelta(seconds=60))
    times = []
    for step in range(steps):
        box = [decode_message(num_reqs, step) if rank == 0 else None]
        start = time.perf_counter()
        dist.broadcast_object_list(box, src=0)
        dist.barrier()  # the acknowledgement, as in the pipe's round trip
        times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(1e6 * median(times))
    dist.destroy_process_group()


def bench_gloo(ranks: int, num_reqs: int, steps: int) -> float:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, ranks, port, num_reqs, steps, out))
             for r in range(ranks)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join()
    return float(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child()
        return
    pipe = bench_pipe(args.ranks, args.requests, args.steps)
    gloo = bench_gloo(args.ranks, args.requests, args.steps)
    print(f"ranks {args.ranks}, decode step of {args.requests} requests, message "
          f"{pipe['bytes']} bytes, median of {args.steps} steps")
    print(f"pipe (warmgate): {pipe['round_trip_us']:.1f} us per decode step round trip, "
          f"{pipe['send_us']:.1f} us to pickle and send")
    print(f"gloo broadcast_object_list + barrier: {gloo:.1f} us per decode step")


if __name__ == "__main__":
    main()
