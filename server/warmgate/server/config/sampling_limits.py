"""Limits on a request's sampling options that the API validates and the runner sizes for.

Torch-free so the gRPC layer can validate a request without importing the runner; the runner
checks a scheduled request against the same numbers (runner/validation.py).

The float ranges keep every step of the sampler finite in float32 for any real logits: the
processors and the temperature can only scale or shift them by bounded amounts (the test
tests/test_sampling_bounds.py runs the sampler at every limit at once)."""

import struct


def float32(value: float) -> float:
    """`value` as a proto float field carries it: a client's 0.01 arrives as 0.0099999998,
    which a bound of 0.01 would refuse."""
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


# Largest top-n a request may ask for, per generated or prompt token (vLLM's default cap); the
# warmup runs the logprobs gather at this width so no request compiles a wider one.
MAX_LOGPROBS = 20
# OpenAI's range for presence_penalty and frequency_penalty: a logit moves by at most
# 2 * (1 + tokens generated), finite for any max_model_len.
MAX_ABS_PENALTY = 2.0
# repetition_penalty p divides a positive logit by p and multiplies a negative one by p, so
# both ends scale a logit by at most 100. Unbounded, p = 6e-38 turned logits of 30 into inf
# (and p = 1e38 turned -30 into -inf, every seen token banned): the softmax gave NaN and the
# sampler token 0, or a token the grammar forbids. transformers' useful range is about
# 0.5-2; these ends leave room without leaving float32 (|logit| * 100 / 1e-5 temperature).
MIN_REPETITION_PENALTY = float32(0.01)
MAX_REPETITION_PENALTY = 100.0
# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): logits / 1e-38 overflow
# float32 to inf and the softmax to NaN, which returned junk tokens with finish LENGTH.
# No upper bound: dividing by a large temperature only shrinks the logits towards a uniform
# draw, finite up to float32's largest.
GREEDY_BELOW_TEMPERATURE = 1e-5
# OpenAI's range for a logit bias: -100 bans a token, 100 all but forces it.
MAX_ABS_LOGIT_BIAS = 100.0
