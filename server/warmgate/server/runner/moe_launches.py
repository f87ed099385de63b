"""The fused MoE kernel's launch in use per token-count bucket (one per model: every MoE layer
has the same expert shape).

A bucket gets the table's launch (config.moe_kernel), or, where a timer is attached (the
runner's, on CUDA: runner.moe_tuning), the fastest of a few candidates timed on the device.
The warmup's `moe` phase fills every bucket a forward can reach and keeps the winners in the
compile cache entry; a bucket found empty after ready is tuned then and reported through
`on_autotune` (the JIT monitor's "autotune" event), the same first-use cost as a compile.
The lookup is host-side, on the token count alone, so a CUDA graph captures its launch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from warmgate.server.config.moe_kernel import (
    ExpertShape,
    MoELaunch,
    bucket_of,
    candidates,
    table_launch,
)

logger = logging.getLogger(__name__)

# (launch, token count) -> seconds one fused_moe call takes on the device.
LaunchTimer = Callable[[MoELaunch, int], float]
# (what was tuned, seconds it took): reported as a JIT event.
AutotuneListener = Callable[[str, float], None]


class MoELaunches:
    """The launch in use per token-count bucket for one expert shape, shared by a model's
    MoE layers (they all have the shape)."""

    def __init__(self, shape: ExpertShape, max_tokens: int | None = None) -> None:
        self.shape = shape
        self.max_tokens = max_tokens
        self.chosen: dict[int, MoELaunch] = {}
        # Attached by the runner on CUDA: a timer makes an empty bucket autotune.
        self.timer: LaunchTimer | None = None
        self.on_autotune: AutotuneListener | None = None
        # Whether a CUDA graph is being captured on this thread (the runner's, on CUDA).
        self.capturing: Callable[[], bool] | None = None
        # Buckets tuned in this process, and the seconds each tune took (compiles included).
        self.tuned_seconds: dict[int, float] = {}

    def launch(self, num_tokens: int) -> MoELaunch:
        """The launch for a forward of num_tokens tokens (host-side, graph-safe)."""
        bucket = bucket_of(num_tokens)
        found = self.chosen.get(bucket)
        if found is not None:
            return found
        if self.timer is None or (self.capturing is not None and self.capturing()):
            # Timing syncs, which a CUDA graph capture cannot hold: the table's then.
            found = self.chosen[bucket] = table_launch(bucket, self.shape, self.max_tokens)
            return found
        return self.tune(bucket, num_tokens)

    def tune(self, bucket: int, num_tokens: int) -> MoELaunch:
        """Time every candidate at num_tokens and keep the fastest for the bucket."""
        assert self.timer is not None, "tune needs a timer (the runner attaches one on CUDA)"
        start = time.perf_counter()
        timed = [(self.timer(c, num_tokens), c)
                 for c in candidates(bucket, self.shape, self.max_tokens)]
        best_s, best = min(timed, key=lambda t: t[0])
        seconds = time.perf_counter() - start
        self.chosen[bucket] = best
        self.tuned_seconds[bucket] = seconds
        logger.info("fused MoE autotune: bucket <=%d (%s) at %d tokens: %s in %.1f us, the "
                    "slowest of %d candidates %.1f us; %.3f s", bucket, self.shape.key(),
                    num_tokens, best, best_s * 1e6, len(timed),
                    max(t for t, _ in timed) * 1e6, seconds)
        if self.on_autotune is not None:
            self.on_autotune(f"fused_moe {self.shape.key()} bucket<={bucket}", seconds)
        return best

    def preset(self, chosen: Mapping[int, MoELaunch]) -> None:
        """Launches chosen earlier (the compile cache entry's): used, never re-tuned."""
        self.chosen.update(chosen)
