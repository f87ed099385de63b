#!/usr/bin/env python3
"""How fast does it serve? Time to first token, inter-token latency and throughput over
gRPC, and the decode step and kernels underneath."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
from toolbox import Command, run

COMMANDS = {
    "load-gen": Command("load_gen.py", "a seeded stream of Generate requests: TTFT, ITL and "
                                       "end-to-end percentiles, output tokens/s"),
    "throughput": Command("throughput.py", "output tok/s, ITL and TTFT at a sweep of "
                                           "concurrent streams against the HBM roofline"),
    "frontend-cost": Command("frontend_cost.py", "CPU time per streamed message in the server's "
                                                 "front, its engine process and the client"),
    "host-step": Command("host_step.py", "host time per served step on the CPU, split into "
                                         "schedule, prepare, forward, sample, update, respond"),
    "decode-latency": Command("decode_latency.py", "decode step time: CUDA graphs vs eager, "
                                                   "each attention backend vs torch"),
    "step-kernels": Command("step_kernels.py", "a decode step's GPU time kernel by kernel "
                                               "(torch.profiler, CUDA graphs on)"),
    "kernels": Command("kernels_gpu.py", "the Triton paged decode attention kernel vs SDPA"),
    "dense-gemv": Command("dense_gemv_gpu.py", "decode-sized dense GEMMs: cuBLAS vs the Triton "
                                               "GEMV per projection shape and row count, "
                                               "against HBM"),
    "launch-sweep": Command("launch_sweep_gpu.py", "the decode-sized kernels' launches on a "
                                                   "grid (GEMV tiles, warps, stages; the "
                                                   "per-slot MoE kernels), fastest first"),
    "cpu-threads": Command("cpu_threads.py", "serving on a CPU with torch's default threads "
                                             "vs warmgate's --cpu-threads"),
    "tp-broadcast": Command("tp_broadcast.py", "tensor parallel: the cost per decode step of "
                                               "sending the step to the workers"),
    "engine-transport": Command("engine_transport.py", "the engine process: a step's events "
                                                       "and a submit round trip, pipe vs "
                                                       "multiprocessing.connection vs others"),
    "determinism": Command("determinism.py", "--deterministic: probes alone vs inside a busy "
                                             "workload bit for bit, and its cost against the "
                                             "default mode"),
    "ttft-path": Command("ttft_path.py", "client and server TTFT of sequential Generates, "
                                         "the engine's RUN from the worker thread vs the event "
                                         "loop, grpc's default channel vs warmgate's, beside "
                                         "gRPC's own floor"),
    "tp-greedy": Command("tp_greedy.py", "tensor parallel: greedy tokens at TP=N against TP=1, "
                                         "prompt by prompt"),
}

if __name__ == "__main__":
    sys.exit(run("bench/serve.py", __doc__, COMMANDS, sys.argv[1:]))
