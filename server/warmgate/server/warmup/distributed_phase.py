"""The `distributed` phase's result: the slowest rank's seconds, every rank's in shapes."""

from __future__ import annotations

from typing import Any

from warmgate.server.core.phases import DISTRIBUTED
from warmgate.server.core.results import PhaseResult, PhaseStatus


def distributed_phase(runner: Any) -> PhaseResult:
    """Run every collective at every size class on every rank (runner.warm_collectives)."""
    plan, seconds = runner.warm_collectives()
    tp = runner.tensor_parallel
    shapes = {"tensor_parallel_size": tp.size, "rank_seconds": [round(s, 6) for s in seconds],
              **plan}
    return PhaseResult(
        name=DISTRIBUTED, status=PhaseStatus.RAN, duration_s=max(seconds),
        num_steps=len(plan["all_reduce_tokens"]) + len(plan["all_gather_rows"]),
        shapes=shapes,
        detail=f"{tp.size} ranks: all-reduce at {len(plan['all_reduce_tokens'])} token counts, "
               f"all-gather at {len(plan['all_gather_rows'])} logits row counts; slowest rank "
               f"{seconds.index(max(seconds))} ({max(seconds):.3f} s)")
