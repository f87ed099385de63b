"""torch.compile: every dynamo frame compile (first compiles and recompiles alike), and the
inductor FX graphs each one generated code for or found in inductor's cache.

Dynamo runs `torch._dynamo.callback_handler`'s start and end callbacks around each frame
it compiles (`register_start_callback` / `register_end_callback`, present from torch 2.5
through 2.14). The compile id "frame/attempt" tells a recompile (attempt > 0, a guard
failed: a new shape under dynamic=False) from a first compile. Inductor's own counters
(`torch._dynamo.utils.counters["inductor"]`: fxgraph_cache_miss / _bypass / _hit), read around
the same window, say whether inductor generated code (a miss) or loaded it (a hit).
`torch._dynamo.reset()` drops every registered callback; `rearm` puts ours back.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from warmgate.server.jit.events import DYNAMO, INDUCTOR
from warmgate.server.jit.monitor import JitMonitor

logger = logging.getLogger(__name__)

_COMPILE_ID = re.compile(r"(\d+)/(\d+)")
_MISS_KEYS = ("fxgraph_cache_miss", "fxgraph_cache_bypass")
_HIT_KEY = "fxgraph_cache_hit"


def _inductor_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return sum(inductor[k] for k in _MISS_KEYS), inductor[_HIT_KEY]


def _is_dynamo_trigger(args: Any) -> bool:
    trigger = getattr(args, "callback_trigger", None)
    # Other triggers (lazy backward, cudagraph recording) are not frame compiles.
    return trigger is None or getattr(trigger, "name", "") == "DYNAMO"


class DynamoObserver:
    name = DYNAMO
    after_weights = False

    def __init__(self) -> None:
        self._monitor: JitMonitor | None = None
        self._handler: Any = None
        self._local = threading.local()
        self._start_cb = self._on_start
        self._end_cb = self._on_end

    def install(self, monitor: JitMonitor) -> bool:
        import torch._dynamo

        handler = getattr(torch._dynamo, "callback_handler", None)
        if handler is None or not hasattr(handler, "register_start_callback"):
            logger.warning("this torch has no dynamo callback_handler; torch.compile compiles "
                           "are not counted")
            return False
        self._handler, self._monitor = handler, monitor
        self.rearm()
        return True

    def rearm(self) -> None:
        handler = self._handler
        if handler is None:
            return
        if self._start_cb not in handler.start_callbacks:
            handler.register_start_callback(self._start_cb)
        if self._end_cb not in handler.end_callbacks:
            handler.register_end_callback(self._end_cb)

    def uninstall(self) -> None:
        handler, self._handler, self._monitor = self._handler, None, None
        if handler is None:
            return
        if self._start_cb in handler.start_callbacks:
            handler.remove_start_callback(self._start_cb)
        if self._end_cb in handler.end_callbacks:
            handler.remove_end_callback(self._end_cb)

    def _on_start(self, args: Any = None) -> None:
        if self._monitor is not None and _is_dynamo_trigger(args):
            self._local.start = (time.perf_counter(), _inductor_counts())

    def _on_end(self, args: Any = None) -> None:
        monitor, start = self._monitor, getattr(self._local, "start", None)
        self._local.start = None
        if monitor is None or start is None or not _is_dynamo_trigger(args):
            return
        seconds = time.perf_counter() - start[0]
        misses, hits = _inductor_counts()
        compile_id = str(getattr(args, "compile_id", "") or "?")
        match = _COMPILE_ID.search(compile_id)
        recompile = bool(match and int(match.group(2)) > 0)
        name = f"frame {compile_id}{' (recompile)' if recompile else ''}"
        monitor.record(DYNAMO, name=name, compiled=True, seconds=seconds)
        for _ in range(misses - start[1][0]):
            monitor.record(INDUCTOR, name=name, compiled=True)
        for _ in range(hits - start[1][1]):
            monitor.record(INDUCTOR, name=name, compiled=False)
