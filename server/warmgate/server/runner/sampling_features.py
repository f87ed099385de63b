"""The sampling features a request uses, by name: the `feature` label of
warmgate_generate_request_features_total and the warmup's sub-step names."""

from __future__ import annotations

from warmgate.server.runner.scheduler_output import SamplingParams

SAMPLING_FEATURES = ("logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "min_p", "min_tokens", "logit_bias")


def sampling_features(params: SamplingParams) -> list[str]:
    """The features of SAMPLING_FEATURES that `params` turns on (in that order)."""
    on = {"logprobs": params.logprobs is not None,
          "prompt_logprobs": params.prompt_logprobs is not None,
          "presence_penalty": params.presence_penalty != 0.0,
          "frequency_penalty": params.frequency_penalty != 0.0,
          "repetition_penalty": params.repetition_penalty != 1.0,
          "min_p": params.min_p > 0.0,
          "min_tokens": params.min_tokens > 0,
          "logit_bias": bool(params.logit_bias)}
    return [f for f in SAMPLING_FEATURES if on[f]]
