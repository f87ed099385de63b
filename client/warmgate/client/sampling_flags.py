"""Ranges of `warmgate generate`'s sampling flags, checked as the command line is parsed.

A value the server would refuse is a bad command line (exit 64, the flag named), never a
round trip that ends in an RPC error (exit 3). The numbers are the server's
(warmgate.server.config.sampling_limits and the request checks in warmgate.server.api); the
client imports no server code, so they are written here too and
tests/test_cli_sampling_flags.py checks that both sides agree.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

# The server's sampling_limits: MAX_LOGPROBS, MAX_ABS_PENALTY, MIN/MAX_REPETITION_PENALTY,
# MAX_ABS_LOGIT_BIAS; and its MAX_LOGIT_BIAS_ENTRIES.
MAX_LOGPROBS = 20
MAX_ABS_PENALTY = 2.0
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 100.0
MAX_ABS_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_ENTRIES = 300
# The proto's field widths: int32 counts and ids, a uint64 seed.
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def float_range(low: float, high: float | None, *, low_open: bool = False
                ) -> Callable[[str], float]:
    """An argparse type: a finite float in [low, high] ((low, high] with low_open; no upper
    bound when high is None)."""
    shown = f"{'(' if low_open else '['}{low:g}, {'inf)' if high is None else f'{high:g}]'}"

    def parse(text: str) -> float:
        value = float(_number(text, float))
        above = value > low if low_open else value >= low
        if not (above and (high is None or value <= high)):
            raise argparse.ArgumentTypeError(f"must be in {shown}, got {text!r}")
        return value

    return parse


def int_range(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {text!r}")
        return value

    return parse


temperature = float_range(0.0, None)
top_p = float_range(0.0, 1.0, low_open=True)
min_p = float_range(0.0, 1.0)
penalty = float_range(-MAX_ABS_PENALTY, MAX_ABS_PENALTY)
repetition_penalty = float_range(MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
logprobs = int_range(0, MAX_LOGPROBS)
top_k = int_range(0, INT32_MAX)
max_tokens = int_range(1, INT32_MAX)
min_tokens = int_range(0, INT32_MAX)
seed = int_range(0, UINT64_MAX)


def logit_bias_item(text: str) -> tuple[int, float]:
    """'42=-1.5' -> (42, -1.5), the bias in [-MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS]."""
    token, sep, bias = text.partition("=")
    token = token.strip()
    if not sep or not (token.isascii() and token.isdigit()) or int(token) > INT32_MAX:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID=BIAS like 42=-1.5, got {text!r}")
    try:
        value = float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected TOKEN_ID=BIAS like 42=-1.5, got {text!r}") from None
    if not (math.isfinite(value) and abs(value) <= MAX_ABS_LOGIT_BIAS):
        raise argparse.ArgumentTypeError(f"bias must be in [-{MAX_ABS_LOGIT_BIAS:g}, "
                                         f"{MAX_ABS_LOGIT_BIAS:g}], got {text!r}")
    return int(token), value


def cross_check(args: argparse.Namespace) -> str | None:
    """What is wrong between flags that are each valid alone, as a usage message, or None."""
    entries = len(dict(args.logit_bias))  # a repeated id is one entry, the last bias kept
    if entries > MAX_LOGIT_BIAS_ENTRIES:
        return (f"argument --logit-bias: {entries} token ids, at most "
                f"{MAX_LOGIT_BIAS_ENTRIES}")
    if args.max_tokens is not None and args.min_tokens > args.max_tokens:
        return (f"argument --min-tokens: must be at most --max-tokens ({args.max_tokens}), "
                f"got {args.min_tokens}")
    return None
