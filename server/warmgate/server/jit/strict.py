"""--strict-jit: what a compile after ready does. off: nothing beyond the counters; warn: a
log line naming the batch that caused it; fail: an error line, and `on_fail(reason)`, which
the controller turns into state FAILED and health NOT_SERVING. A CUDA-graph miss after ready
(a uniform decode that ran eagerly because no captured graph fits) is treated the same: it is
the same first-use cost serving was promised it would not pay, and so is a communicator
set-up after ready under tensor parallel (the first use of a collective kind on a rank). Under
tensor parallel the policy sees every rank's events (a worker's relayed to rank 0)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from warmgate.server.config.flag_values import STRICT_MODES
from warmgate.server.jit.events import COMMUNICATOR_SETUP, CUDA_GRAPH_MISS, JitEvent

logger = logging.getLogger(__name__)


class StrictJitPolicy:
    def __init__(self, mode: str, on_fail: Callable[[str], None]) -> None:
        if mode not in STRICT_MODES:
            raise ValueError(f"strict_jit must be one of {', '.join(STRICT_MODES)}, got {mode!r}")
        self.mode = mode
        self._on_fail = on_fail

    def __call__(self, event: JitEvent) -> None:
        # Cache loads are first uses in this process but no compiler ran: they never fail.
        if not event.after_ready or self.mode == "off" or not event.compiled:
            return
        is_miss = event.kind == CUDA_GRAPH_MISS
        is_setup = event.kind == COMMUNICATOR_SETUP
        what = ("CUDA-graph miss" if is_miss else "communicator set-up" if is_setup
                else "compile")
        reason = f"{what} after ready: {event.describe()}"
        if self.mode == "fail" and (event.is_compile or is_miss or is_setup):
            logger.error("%s (--strict-jit=fail: health turns NOT_SERVING)", reason)
            self._on_fail(reason)
        else:
            logger.warning("%s; warm this shape up (--strict-jit=%s)", reason, self.mode)
