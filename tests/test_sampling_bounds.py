"""The sampling floats are bounded where the sampler's float32 math stays finite, and a bad
value is INVALID_ARGUMENT naming only the field that is wrong.

A repetition_penalty of 6e-38 used to pass validation and turn logits into inf (the output
was token 0 repeated; with a grammar, INTERNAL); `max_tokens=-5` also reported a spurious
`sampling.min_tokens` violation."""

from __future__ import annotations

import itertools
import math
import re

import grpc
import pytest
import torch

from tests.grpc_harness import run, server_config, serving
from tests.runner_helpers import make_runner, prompt, tiny_config
from tests.test_grpc_generate import collect
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.api.generate_request import parse_generate_request
from warmgate.server.config.sampling_limits import (
    GREEDY_BELOW_TEMPERATURE,
    MAX_ABS_LOGIT_BIAS,
    MAX_ABS_PENALTY,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
)
from warmgate.server.core.errors import InvalidArgument
from warmgate.server.runner.sampling.processors import apply_logits_processors
from warmgate.server.runner.sampling.rows import SamplingRows, TokenHistory
from warmgate.server.runner.sampling.warpers import probabilities
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.warmup.steps import new_request, scheduler_output
from warmgate.v1 import generate_pb2 as gen_pb

CONFIG = tiny_config()
VOCAB = CONFIG.model.vocab_size
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# Far beyond any model's logits (|logit| of a few tens), and the bias on top.
LOGIT_SCALE = 1e3


def _sample(params: SamplingParams, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed logits, probabilities) of one row that has seen every token, each
    generated many times (the penalties' worst case)."""
    seen = list(range(VOCAB))
    history = TokenHistory(seen, seen * 8)
    rows = SamplingRows.of([params], [history], torch.device("cpu"))
    processed = apply_logits_processors(logits.clone(), rows)
    return processed, probabilities(processed, [params])


LIMITS = list(itertools.product(
    (MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY),
    (GREEDY_BELOW_TEMPERATURE, FLOAT32_MAX),
    (-MAX_ABS_PENALTY, MAX_ABS_PENALTY),
    (0.0, 1.0),
    (-MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS)))


@pytest.mark.parametrize(("repetition", "temperature", "penalty", "min_p", "bias"), LIMITS)
def test_the_sampler_stays_finite_at_every_limit_at_once(
        repetition: float, temperature: float, penalty: float, min_p: float,
        bias: float) -> None:
    params = SamplingParams(
        temperature=temperature, repetition_penalty=repetition, presence_penalty=penalty,
        frequency_penalty=penalty, min_p=min_p,
        logit_bias=tuple((t, bias) for t in range(0, VOCAB, 2)))
    # Every logit on one side of zero, too: the penalty then pushes all of them one way.
    for logits in (torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0)),
                   -torch.rand(1, VOCAB), torch.rand(1, VOCAB)):
        processed, probs = _sample(params, logits * LOGIT_SCALE)
        assert torch.isfinite(processed).all()
        assert torch.isfinite(probs).all() and math.isclose(probs.sum().item(), 1.0,
                                                            rel_tol=1e-4)


def test_the_reported_penalty_is_outside_the_finite_range() -> None:
    """What the bounds guard: the issue's value overflows the same step to inf and NaN."""
    params = SamplingParams(repetition_penalty=6e-38)
    processed, probs = _sample(params, torch.rand(1, VOCAB) * 30)
    assert not torch.isfinite(processed).all() and torch.isnan(probs).any()


def _request(**sampling: object) -> gen_pb.GenerateRequest:
    sampling.setdefault("max_tokens", 8)
    return gen_pb.GenerateRequest(prompt_token_ids=[1, 2, 3],
                                  sampling=gen_pb.SamplingParams(**sampling))  # type: ignore


def _fields(request: gen_pb.GenerateRequest) -> list[str]:
    with pytest.raises(InvalidArgument) as info:
        parse_generate_request(request, CONFIG)
    return [v.field for v in info.value.violations]


@pytest.mark.parametrize("value", [6e-38, 1e-30, 0.0099, 100.5, 1e38, -1.0, math.nan])
def test_a_repetition_penalty_outside_the_range_is_refused_naming_it(value: float) -> None:
    assert _fields(_request(repetition_penalty=value)) == ["sampling.repetition_penalty"]


@pytest.mark.parametrize("value", [0.01, 0.5, 1.0, 100.0])
def test_a_repetition_penalty_inside_the_range_reaches_the_params(value: float) -> None:
    params = parse_generate_request(_request(repetition_penalty=value), CONFIG).params
    assert math.isclose(params.repetition_penalty, value, rel_tol=1e-6)


def test_a_large_temperature_is_accepted() -> None:
    """No upper bound: the sampler stays finite up to float32's largest (above)."""
    params = parse_generate_request(_request(temperature=FLOAT32_MAX), CONFIG).params
    assert params.temperature == FLOAT32_MAX


@pytest.mark.parametrize(("params", "message"), [
    (SamplingParams(repetition_penalty=6e-38), "repetition_penalty 6e-38 is outside"),
    (SamplingParams(repetition_penalty=1e38), "repetition_penalty 1e+38 is outside"),
    (SamplingParams(temperature=1e-38), "temperature 1e-38 is outside"),
    (SamplingParams(min_p=math.nan), "min_p nan is outside"),
    (SamplingParams(presence_penalty=-3.0), "presence_penalty -3.0 is outside"),
    (SamplingParams(logit_bias=((3, 1e9),)), "logit_bias 3: 1000000000.0 is outside"),
])
def test_the_runner_refuses_unbounded_floats_before_touching_its_state(
        params: SamplingParams, message: str) -> None:
    """Scheduler outputs are untrusted (they will arrive over RPCs): the runner checks the
    same ranges, as a ValueError naming the request and the option."""
    runner = make_runner()
    so = scheduler_output(new_reqs=[new_request("p", prompt(4), ([1, 2],), params)],
                          num_scheduled={"p": 4})
    with pytest.raises(ValueError, match=re.escape(f"'p': {message}")):
        runner.execute_model(so)
    assert not runner.input_batch.requests


@pytest.mark.parametrize(("sampling", "fields"), [
    ({"max_tokens": -5}, ["sampling.max_tokens"]),
    ({"max_tokens": 0, "min_tokens": 3}, ["sampling.max_tokens"]),
    ({"max_tokens": -5, "min_tokens": -1}, ["sampling.max_tokens", "sampling.min_tokens"]),
    ({"max_tokens": 8, "min_tokens": 9}, ["sampling.min_tokens"]),
    # min_tokens over max_tokens and beside a grammar: one violation on it, not two (the
    # preset has no tokenizer, which the grammar's own violation says).
    ({"max_tokens": 8, "min_tokens": 9, "regex": "a+"},
     ["sampling.min_tokens", "sampling.regex"]),
])
def test_only_the_fields_that_are_wrong_are_reported(sampling: dict[str, object],
                                                     fields: list[str]) -> None:
    assert _fields(_request(**sampling)) == fields


def test_a_live_server_names_only_the_bad_field_and_keeps_serving() -> None:
    async def body() -> None:
        async with serving(server_config()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            for kwargs, field in (({"repetition_penalty": 6e-38}, "sampling.repetition_penalty"),
                                  ({"repetition_penalty": 1e38}, "sampling.repetition_penalty"),
                                  ({"max_tokens": -5}, "sampling.max_tokens")):
                with pytest.raises(WarmgateRpcError) as info:
                    await collect(c, [1, 2, 3], **kwargs)
                assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
                assert [v.subject for v in info.value.field_violations] == [field]
            # The server keeps serving, the lowest penalty allowed included.
            got = await collect(c, [5, 6, 7, 8], max_tokens=6, temperature=0.7, seed=3,
                                repetition_penalty=0.01)
            assert len(got.token_ids) == 6 and got.finish_reason == "length"

    run(body(), 120)
