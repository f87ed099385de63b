"""The values a flag accepts: each parser turns a flag's (or its environment variable's) text
into a value or raises ValueError saying what is allowed, which the parser reports as one
line naming the flag."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from warmgate.server.config.attention_backends import backend_names

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# What a JIT compile after ready does (warmgate.server.jit.strict): count it, log it, or also
# fail readiness.
STRICT_MODES = ("off", "warn", "fail")
# -1 turns an optional listener (metrics, the health-only port) off; 0 binds a free port.
PORT_DISABLED = -1


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be between 0 and 65535")
    return value


def optional_port(text: str) -> int:
    value = int(text)
    if value != PORT_DISABLED and not 0 <= value <= 65535:
        raise ValueError("must be between 0 and 65535, or -1 to disable")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    # NaN compares false with everything: unchecked, a NaN timeout waits forever.
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a finite number > 0")
    return value


def attention_backend(text: str) -> str:
    choices = ("auto", *backend_names())
    if text not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}")
    return text


def log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def strict_jit(text: str) -> str:
    if text.lower() not in STRICT_MODES:
        raise ValueError(f"must be one of {', '.join(STRICT_MODES)}")
    return text.lower()


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


# The parser of a field without an explicit one, by its annotation.
BY_ANNOTATION: dict[str, Callable[[str], Any]] = {
    "int": int, "int | None": int, "str": str, "str | None": str, "bool": boolean,
}
