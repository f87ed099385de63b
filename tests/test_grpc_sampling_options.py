"""The sampling options on Generate: each bad value is INVALID_ARGUMENT naming its field, the
parsed values reach SamplingParams, and through a real server (tiny model, CPU) logprobs,
min_tokens and logit_bias do what they say, from the Python client and `warmgate generate`."""

from __future__ import annotations

import io
import json
import math

import grpc
import pytest

from tests.grpc_harness import ServerThread, run, server_config, serving
from tests.runner_helpers import tiny_config
from tests.test_grpc_generate import collect
from warmgate.client import cli
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.api.generate_request import parse_generate_request
from warmgate.server.core.errors import InvalidArgument
from warmgate.server.runner.sampling_features import SAMPLING_FEATURES
from warmgate.v1 import generate_pb2 as gen_pb

CONFIG = tiny_config()
VOCAB = CONFIG.model.vocab_size


def _request(**sampling: object) -> gen_pb.GenerateRequest:
    sampling.setdefault("max_tokens", 8)
    return gen_pb.GenerateRequest(prompt_token_ids=[1, 2, 3],
                                  sampling=gen_pb.SamplingParams(**sampling))  # type: ignore


@pytest.mark.parametrize(("sampling", "field"), [
    ({"logprobs": 21}, "sampling.logprobs"),
    ({"logprobs": -1}, "sampling.logprobs"),
    ({"prompt_logprobs": 21}, "sampling.prompt_logprobs"),
    ({"presence_penalty": 2.5}, "sampling.presence_penalty"),
    ({"presence_penalty": math.nan}, "sampling.presence_penalty"),
    ({"frequency_penalty": -2.01}, "sampling.frequency_penalty"),
    ({"repetition_penalty": 0.0}, "sampling.repetition_penalty"),
    ({"repetition_penalty": math.inf}, "sampling.repetition_penalty"),
    ({"min_p": 1.5}, "sampling.min_p"),
    ({"min_p": math.nan}, "sampling.min_p"),
    ({"min_tokens": 9}, "sampling.min_tokens"),
    ({"min_tokens": -1}, "sampling.min_tokens"),
    ({"logit_bias": {VOCAB: 1.0}}, f"sampling.logit_bias[{VOCAB}]"),
    ({"logit_bias": {-3: 1.0}}, "sampling.logit_bias[-3]"),
    ({"logit_bias": {5: 101.0}}, "sampling.logit_bias[5]"),
    ({"logit_bias": {5: math.nan}}, "sampling.logit_bias[5]"),
    ({"logit_bias": dict.fromkeys(range(301), 1.0)}, "sampling.logit_bias"),
])
def test_each_bad_option_is_invalid_argument_naming_its_field(sampling: dict[str, object],
                                                              field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_generate_request(_request(**sampling), CONFIG)
    assert [v.field for v in info.value.violations] == [field]


def test_options_at_their_limits_are_accepted_and_reach_the_sampling_params() -> None:
    params = parse_generate_request(_request(
        logprobs=20, prompt_logprobs=0, presence_penalty=-2.0, frequency_penalty=2.0,
        repetition_penalty=0.5, min_p=1.0, min_tokens=8,
        logit_bias={VOCAB - 1: -100.0, 0: 100.0, 7: 0.0}), CONFIG).params
    assert (params.logprobs, params.prompt_logprobs) == (20, 0)
    assert (params.presence_penalty, params.frequency_penalty) == (-2.0, 2.0)
    assert (params.repetition_penalty, params.min_p, params.min_tokens) == (0.5, 1.0, 8)
    assert params.logit_bias == ((0, 100.0), (VOCAB - 1, -100.0))  # sorted; 0 bias dropped
    plain = parse_generate_request(_request(), CONFIG).params
    assert (plain.logprobs, plain.prompt_logprobs, plain.repetition_penalty) == (None, None,
                                                                                 1.0)
    assert not plain.has_penalties and plain.min_p == 0.0 and plain.logit_bias == ()


def test_generate_with_options_through_a_real_server() -> None:
    async def body() -> None:
        async with serving(server_config()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            with pytest.raises(WarmgateRpcError) as info:
                await collect(c, [1, 2, 3], min_p=-0.5)
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert [v.subject for v in info.value.field_violations] == ["sampling.min_p"]
            got = await collect(c, [1, 2, 3, 4], max_tokens=6, logprobs=3, prompt_logprobs=1,
                                logit_bias={42: 100.0}, presence_penalty=0.5)
            assert got.token_ids == [42] * 6
            assert [e.token.token_id for e in got.logprobs] == got.token_ids
            assert all(len(e.top) == 3 and e.token.logprob <= 0 for e in got.logprobs)
            assert [e.token.token_id for e in got.prompt_logprobs] == [2, 3, 4]
            # min_tokens masks the stop id the bias would otherwise pick at once.
            got = await collect(c, [1, 2, 3], max_tokens=8, stop_token_ids=[42],
                                logit_bias={42: 100.0}, min_tokens=5)
            assert got.finish_reason == "stop" and len(got.token_ids) == 6
            assert got.token_ids[-1] == 42 and 42 not in got.token_ids[:5]
            reg = s.metrics.registry
            counts = {f: reg.get_sample_value("warmgate_generate_request_features_total",
                                              {"feature": f}) for f in SAMPLING_FEATURES}
            assert counts == {**dict.fromkeys(SAMPLING_FEATURES, 0.0), "logprobs": 1.0,
                              "prompt_logprobs": 1.0, "logit_bias": 2.0,
                              "presence_penalty": 1.0, "min_tokens": 1.0}

    run(body(), 120)


def test_cli_generate_takes_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(server_config()) as server:
        server.call(server.running.controller.warmup_kernels())
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--target", server.target, "--json", "generate", "--prompt-ids",
                         "1,2,3", "--max-tokens", "4", "--logprobs", "2", "--prompt-logprobs",
                         "0", "--logit-bias", "9=100", "--logit-bias", "10=-5",
                         "--presence-penalty", "0.1", "--frequency-penalty", "0.2",
                         "--repetition-penalty", "1.1", "--min-p", "0.05", "--min-tokens",
                         "2"], out=out, err=err)
        assert code == 0, err.getvalue()
        result = json.loads(out.getvalue())
        assert result["token_ids"] == [9] * 4
        assert [e["token_id"] for e in result["logprobs"]] == [9] * 4
        assert all(len(e["top"]) == 2 for e in result["logprobs"])
        assert [e["token_id"] for e in result["prompt_logprobs"]] == [2, 3]
        # The vocabulary is the server's to judge: an RPC error naming the field.
        assert cli.main(["--target", server.target, "generate", "--prompt-ids", "1",
                         "--logit-bias", "99999999=1"], out=out, err=err) == \
            cli.EXIT_RPC_ERROR
        assert "sampling.logit_bias[99999999]" in err.getvalue()
    # A range the CLI knows is a usage error before any RPC (tests/test_cli_sampling_flags.py).
    for bad, message in ((["--logit-bias", "nine=1"], "--logit-bias: expected TOKEN_ID=BIAS"),
                         (["--logprobs", "99"], "--logprobs: must be in [0, 20]")):
        with pytest.raises(SystemExit) as info:
            cli.main(["generate", "--prompt-ids", "1", *bad], out=out, err=err)
        assert info.value.code == cli.EXIT_USAGE
        assert message in capsys.readouterr().err
