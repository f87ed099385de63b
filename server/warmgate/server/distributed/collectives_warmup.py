"""The `distributed` warmup phase: every collective the model runs, at every size class, on
every rank, before ready; each rank's seconds gathered to rank 0.

NCCL (and gloo) set up lazily: a communicator, its buffers, the channels of a protocol are
made by the first collective that needs them. The model runs two: an all-reduce of
[tokens, hidden] in the served dtype (o_proj, down_proj, the embedding) and an all-gather of
[rows, vocab / N] float32 logits. Both run here at each power of two up to their largest
size, and at the largest.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from warmgate.server.runner.tensor_parallel import TensorParallel


def _size_classes(largest: int) -> list[int]:
    sizes = {largest}
    n = 1
    while n < largest:
        sizes.add(n)
        n *= 2
    return sorted(sizes)


def collective_plan(runner: Any) -> dict[str, Any]:
    """What the phase runs for this runner: token counts and logits rows."""
    return {"all_reduce_tokens": _size_classes(runner.max_num_tokens),
            "all_gather_rows": ([] if runner.is_pooling_model else
                                _size_classes(runner.max_num_reqs * runner.decode_query_len)),
            "dtype": str(runner.dtype).removeprefix("torch.")}


def warm_collectives(tp: TensorParallel, runner: Any, plan: dict[str, Any]) -> list[float]:
    """Run the plan on this rank; every rank's seconds, in rank order (each rank calls it)."""
    hidden = runner.config.model.hidden_size
    dtype = getattr(torch, plan["dtype"])  # the served dtype (collective_plan)
    start = time.perf_counter()
    for tokens in plan["all_reduce_tokens"]:
        tp.all_reduce(torch.zeros(tokens, hidden, dtype=dtype, device=runner.device))
    for rows in plan["all_gather_rows"]:
        tp.gather_logits(torch.zeros(rows, tp.layout.vocab_rows, dtype=torch.float32,
                                     device=runner.device))
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    seconds = time.perf_counter() - start
    return [float(s) for s in tp.gather_objects(seconds)]
