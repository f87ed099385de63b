"""Temperatures below 1e-5 decode greedily (as vLLM does): logits / 1e-38 overflow float32, and
such requests used to return junk tokens that finished LENGTH as if nothing was wrong."""

from __future__ import annotations

import pytest

from tests.runner_helpers import make_runner, prompt
from tests.serving_helpers import Served, reference_greedy
from warmgate.server.api.generate_request import GREEDY_BELOW_TEMPERATURE, parse_generate_request
from warmgate.v1 import generate_pb2 as gen_pb

PROMPT = prompt(9, offset=3)


def _parse(temperature: float, **sampling: int) -> gen_pb.GenerateRequest:
    return gen_pb.GenerateRequest(prompt_token_ids=PROMPT, sampling=gen_pb.SamplingParams(
        temperature=temperature, max_tokens=12, **sampling))


@pytest.mark.parametrize("temperature", [1e-45, 1e-40, 1e-38, 1e-20, 1e-6, 9.9e-6])
def test_temperatures_below_the_threshold_decode_greedily(temperature: float) -> None:
    runner = make_runner()
    parsed = parse_generate_request(_parse(temperature, seed=5), runner.config)
    assert parsed.params.is_greedy and not parsed.params.is_seeded
    served = Served(runner)
    req = served.submit("r", PROMPT, parsed.params)
    served.run()
    assert req.output_token_ids == reference_greedy(make_runner(), PROMPT, 12)


def test_temperatures_from_the_threshold_up_still_sample() -> None:
    config = make_runner().config
    for temperature in (2 * GREEDY_BELOW_TEMPERATURE, 0.5):
        params = parse_generate_request(_parse(temperature, seed=5), config).params
        assert not params.is_greedy and params.is_seeded
        assert params.temperature == pytest.approx(temperature)
