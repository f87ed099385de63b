"""The chat template's sandbox with size bounds: the binary operators that can build a huge
object in one C-level call are checked before they run.

`'x' * 10**9` or `[0] * 10**9` is one C call that no step count or deadline inside the
interpreter can interrupt, and `10 ** 10 ** 10` computes for hours. Interception also keeps
jinja from folding such constants while it compiles the template (BinExpr.as_const refuses
an intercepted operator in a sandbox). Whatever escapes these checks (a filter or a format
width that builds a large string) meets the worker process's memory limit
(text.template_worker) and its time limit (text.template_process).
"""

from __future__ import annotations

from typing import Any

from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

# An integer power above this many bits is refused: a template needs none, and the time of
# a big-integer power grows with its size.
MAX_POWER_BITS = 1 << 16


class RenderBoundError(Exception):
    """A render (or the compile) passed one of its bounds; `bound` names which: output,
    time or memory."""

    def __init__(self, bound: str, message: str) -> None:
        super().__init__(message)
        self.bound = bound


def _size(value: object) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, refusing a `*`, `+` or `**` whose result would pass the bound
    before computing it."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def __init__(self, max_chars: int, **options: Any) -> None:
        super().__init__(**options)
        self.max_chars = max_chars

    def call_binop(self, context: Context, op: str, left: Any, right: Any) -> Any:
        if op == "*":
            self._check_repeat(left, right)
            self._check_repeat(right, left)
        elif op == "+":
            sizes = (_size(left), _size(right))
            if sizes[0] is not None and sizes[1] is not None \
                    and sizes[0] + sizes[1] > self.max_chars:
                raise RenderBoundError("output", f"a concatenation of {sizes[0]} and "
                                       f"{sizes[1]} items passes the output bound of "
                                       f"{self.max_chars} characters")
        elif op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            bits = abs(left).bit_length() * right if abs(left) > 1 else 1
            if bits > MAX_POWER_BITS:
                raise RenderBoundError("output", f"{left} ** {right} has about {bits} bits, "
                                       f"more than the {MAX_POWER_BITS} a template may build")
        return super().call_binop(context, op, left, right)

    def _check_repeat(self, sequence: object, times: object) -> None:
        size = _size(sequence)
        if size is None or not isinstance(times, int):
            return
        if size * times > self.max_chars:
            what = f"string of {size} characters" if isinstance(sequence, str) \
                else f"{type(sequence).__name__} of {size} items"
            raise RenderBoundError("output", f"a {what} times {times} passes the output "
                                   f"bound of {self.max_chars} characters")

