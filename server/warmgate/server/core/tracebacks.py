"""Tracebacks a log can hold: one per failure, and a bounded number of frames.

A failure is often seen twice: a serving step's exception is logged by the loop where it
happened, then reaches every stream of the step, and each stream's RPC ends INTERNAL with it.
`log_failure` writes the traceback the first time and a one-line reference after that. A deep
stack (a RecursionError has about a thousand frames, which alternate between the functions of
the cycle, so Python's "[Previous line repeated]" does not fold them) keeps its first and
last frames, the ones that say where it entered and where it broke.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from typing import Any

HEAD_FRAMES = 20
TAIL_FRAMES = 20
# Set on an exception once its traceback is in the log.
_LOGGED_ATTR = "_warmgate_traceback_logged"


# The file name of the frame that stands in for the omitted ones; its formatted line is
# replaced (StackSummary's per-frame hook is 3.11's, and 3.10 is supported).
_OMITTED = "<warmgate: frames omitted>"


def _shorten(te: traceback.TracebackException) -> None:
    stack = te.stack
    if len(stack) > HEAD_FRAMES + TAIL_FRAMES + 1:
        omitted = len(stack) - HEAD_FRAMES - TAIL_FRAMES
        marker = traceback.FrameSummary(_OMITTED, omitted, "", lookup_line=False, line="")
        te.stack = traceback.StackSummary.from_list([*stack[:HEAD_FRAMES], marker,
                                                     *stack[-TAIL_FRAMES:]])


def compact_traceback(exc: BaseException) -> str:
    """`exc`'s traceback as Python prints it (causes and contexts included), each stack cut
    to its first HEAD_FRAMES and last TAIL_FRAMES frames."""
    top = traceback.TracebackException.from_exception(exc)
    pending: list[traceback.TracebackException | None] = [top]
    seen: set[int] = set()
    while pending:
        te = pending.pop()
        if te is None or id(te) in seen:
            continue
        seen.add(id(te))
        _shorten(te)
        # An ExceptionGroup's members (3.11) have stacks of their own.
        pending += [te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or [])]
    return "".join(_omitted_line(chunk) for chunk in top.format()).rstrip("\n")


def _omitted_line(chunk: str) -> str:
    if _OMITTED not in chunk:
        return chunk
    count = chunk.split(", line ", 1)[1].split(",", 1)[0]
    return f"  [... {count} frames omitted ...]\n"


def traceback_logged(exc: BaseException) -> bool:
    return bool(getattr(exc, _LOGGED_ATTR, False))


def log_failure(logger: logging.Logger, exc: BaseException, message: str, *args: Any) -> None:
    """ERROR `message % args`, with `exc`'s compact traceback unless it is logged already."""
    if traceback_logged(exc):
        logger.error(message + " (%s: %s; its traceback is logged above)", *args,
                     type(exc).__name__, exc)
        return
    # An exception type with __slots__ keeps no mark: it may be logged again.
    with contextlib.suppress(AttributeError):
        setattr(exc, _LOGGED_ATTR, True)
    logger.error(message + "\n%s", *args, compact_traceback(exc))
