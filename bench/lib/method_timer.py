"""Time every call of a method in place, for the benches that split a step into its parts."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any


def time_calls(owner: Any, name: str, record: Callable[[float, float], None]
               ) -> Callable[[], None]:
    """Replace owner.name with a wrapper that calls record(start, seconds) after each call,
    from whichever thread made it; returns the undo."""
    orig = getattr(owner, name)

    @functools.wraps(orig)
    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            record(t, time.perf_counter() - t)

    setattr(owner, name, timed)
    return lambda: setattr(owner, name, orig)
