"""The logprobs, penalty, min_p, min_tokens and logit_bias fields of a GenerateRequest's
SamplingParams, checked (one FieldViolation per bad field) and turned into SamplingParams
keywords."""

from __future__ import annotations

import math
from typing import Any

from warmgate.server.config.sampling_limits import (
    MAX_ABS_LOGIT_BIAS,
    MAX_ABS_PENALTY,
    MAX_LOGPROBS,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
)
from warmgate.server.core.errors import FieldViolation
from warmgate.v1 import generate_pb2 as gen_pb

# A bias entry is one scatter per step; more ids than this belong in a grammar.
MAX_LOGIT_BIAS_ENTRIES = 300


def sampling_options(s: gen_pb.SamplingParams, vocab_size: int, max_tokens: int,
                     bad: list[FieldViolation]) -> dict[str, Any]:
    """SamplingParams keywords; appends to `bad` for every field out of range. `max_tokens`
    below 1 is the caller's violation: min_tokens is then only checked for its sign."""
    opts: dict[str, Any] = {}
    for name in ("logprobs", "prompt_logprobs"):
        if s.HasField(name):
            n = getattr(s, name)
            if not 0 <= n <= MAX_LOGPROBS:
                bad.append(FieldViolation(f"sampling.{name}", f"must be in [0, {MAX_LOGPROBS}] "
                                          f"(0 returns only the token's own), got {n}"))
            opts[name] = n
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(s, name)
        if not (math.isfinite(v) and abs(v) <= MAX_ABS_PENALTY):
            bad.append(FieldViolation(f"sampling.{name}", f"must be in [-{MAX_ABS_PENALTY}, "
                                      f"{MAX_ABS_PENALTY}], got {v}"))
        opts[name] = float(v)
    rep = s.repetition_penalty if s.HasField("repetition_penalty") else 1.0
    if not MIN_REPETITION_PENALTY <= rep <= MAX_REPETITION_PENALTY:  # also false for NaN
        bad.append(FieldViolation("sampling.repetition_penalty", f"must be in "
                                  f"[{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] "
                                  f"(1 disables it), got {rep}"))
    opts["repetition_penalty"] = float(rep)
    if not 0.0 <= s.min_p <= 1.0:  # also false for NaN
        bad.append(FieldViolation("sampling.min_p", f"must be in [0, 1], got {s.min_p}"))
    opts["min_p"] = float(s.min_p)
    if s.min_tokens < 0 or 1 <= max_tokens < s.min_tokens:
        # Bounded by max_tokens only when that is valid: `max_tokens = -5` with the default
        # min_tokens 0 reported a second, spurious violation on min_tokens.
        bad.append(FieldViolation("sampling.min_tokens", f"must be in [0, max_tokens = "
                                  f"{max_tokens}], got {s.min_tokens}" if max_tokens >= 1 else
                                  f"must be >= 0, got {s.min_tokens}"))
    opts["min_tokens"] = s.min_tokens
    opts["logit_bias"] = _logit_bias(dict(s.logit_bias), vocab_size, bad)
    return opts


def _logit_bias(bias: dict[int, float], vocab_size: int, bad: list[FieldViolation]
                ) -> tuple[tuple[int, float], ...]:
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        bad.append(FieldViolation("sampling.logit_bias", f"{len(bias)} entries, at most "
                                  f"{MAX_LOGIT_BIAS_ENTRIES}"))
        return ()
    for token, value in sorted(bias.items()):
        if not 0 <= token < vocab_size:
            bad.append(FieldViolation(f"sampling.logit_bias[{token}]", f"token id {token} is "
                                      f"outside the vocabulary [0, {vocab_size})"))
        elif not (math.isfinite(value) and abs(value) <= MAX_ABS_LOGIT_BIAS):
            bad.append(FieldViolation(f"sampling.logit_bias[{token}]", f"bias must be in "
                                      f"[-{MAX_ABS_LOGIT_BIAS:g}, {MAX_ABS_LOGIT_BIAS:g}], got "
                                      f"{value}"))
    return tuple((t, float(v)) for t, v in sorted(bias.items()) if v != 0.0)
