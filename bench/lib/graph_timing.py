"""What the GPU kernel benches share: a kernel's time per call inside a CUDA graph (the way
decode runs: no launch overhead between calls), and a model preset's projection shapes."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def graph_us(fn: Callable[[int], object], layers: int, replays: int = 15) -> float:
    """Median microseconds per call of `fn(layer)` over a graph of `layers` calls, each
    reading its own layer's data (so a working set larger than L2 crosses HBM)."""
    for i in range(layers):
        fn(i)  # compiles and autotunes outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(layers):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / layers)
    return statistics.median(times)


def projection_shapes(preset: str) -> tuple[dict[str, tuple[int, int]], int]:
    """({projection: (N, K) of its weight}, the model's layer count) from a preset."""
    from warmgate.server.config.runner_config import ModelConfig

    c = ModelConfig.from_preset(preset)
    d = c.head_dim
    return ({"qkv": ((c.num_heads + 2 * c.num_kv_heads) * d, c.hidden_size),
             "o": (c.hidden_size, c.num_heads * d),
             "gate_up": (2 * c.intermediate_size, c.hidden_size),
             "down": (c.hidden_size, c.intermediate_size),
             "head": (c.vocab_size, c.hidden_size)}, c.num_layers)
