"""Generate with text: prompts and chat messages through the model directory's tokenizer and
chat template, text deltas in every response, the model's EOS ids (and ignore_eos), the
validation of the prompt fields, and the CLI's --prompt / --chat."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from tests.grpc_harness import ServerThread, eventually, run, server_config, serving
from tests.serving_helpers import reference_greedy
from tests.text_helpers import smollm2_dir, write_tiny_model
from warmgate.client import cli
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.client.generate import Generation
from warmgate.server.runner.model_runner import ModelRunner

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


async def collect(client: AsyncWarmgateClient, prompt_ids: list[int] | None = None,
                  **kw: Any) -> tuple[Generation, list[str]]:
    """The stream collected, and each message's text."""
    result, texts = Generation(), []
    async for message in client.generate(prompt_ids or (), **kw):
        result.add(message)
        texts.append(message.text)
    return result, texts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's weights with a byte-level tokenizer and a ChatML template."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-text"))


def reference_ids(directory: Path, **request: Any) -> list[int]:
    hf = AutoTokenizer.from_pretrained(directory)
    if "prompt" in request:
        return list(hf(request["prompt"])["input_ids"])
    return list(hf.apply_chat_template(request["messages"], add_generation_prompt=True,
                                       tokenize=True, return_dict=False))


def decode(directory: Path, ids: list[int]) -> str:
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return str(tokenizer.decode(ids, skip_special_tokens=True))


@pytest.mark.parametrize("request_kw", [{"prompt": "The capital of France is"},
                                        {"messages": CAPITAL}], ids=["prompt", "messages"])
def test_text_requests_generate_from_transformers_ids_and_stream_their_text(
        model_dir: Path, request_kw: dict[str, Any]) -> None:
    config = server_config("--model", str(model_dir))
    prompt_ids = reference_ids(model_dir, **request_kw)

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            got, texts = await collect(c, max_tokens=12, **request_kw)
            assert got.usage is not None and got.usage.prompt_tokens == len(prompt_ids)
            assert got.token_ids == reference_greedy(ModelRunner(config.runner), prompt_ids, 12)
            assert got.text == "".join(texts) == decode(model_dir, got.token_ids)
            # The same prompt as ids: the same tokens, and text too (the model has a tokenizer).
            by_ids, _ = await collect(c, prompt_ids, max_tokens=12)
            assert by_ids.token_ids == got.token_ids and by_ids.text == got.text

    run(body(), 120)


@pytest.mark.parametrize(("kwargs", "fields"), [
    ({}, ["prompt_token_ids"]),
    ({"prompt_token_ids": [1], "prompt": "x"}, ["prompt_token_ids", "prompt"]),
    ({"prompt": "x", "messages": CAPITAL}, ["prompt", "messages"]),
    ({"prompt": ""}, ["prompt"]),  # encodes to no tokens: this tokenizer adds no BOS
    ({"messages": [{"role": "", "content": "x"}]}, ["messages[0].role"]),
    ({"prompt": "Paris " * 200}, ["prompt"]),  # past max_model_len
])
def test_bad_prompts_name_their_fields(model_dir: Path, kwargs: dict[str, Any],
                                       fields: list[str]) -> None:
    ids = kwargs.pop("prompt_token_ids", None)

    async def body() -> None:
        async with serving(server_config("--model", str(model_dir), "--serve-before-ready")
                           ) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            with pytest.raises(WarmgateRpcError) as info:
                await collect(c, ids, **kwargs)
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert [v.subject for v in info.value.field_violations] == fields

    run(body(), 60)


def test_text_to_a_model_without_a_tokenizer_names_the_missing_file(tmp_path: Path) -> None:
    write_tiny_model(tmp_path)
    (tmp_path / "tokenizer.json").unlink()

    async def body() -> None:
        for flags in (("--model", str(tmp_path)), ("--model", "tiny")):
            async with serving(server_config(*flags, "--serve-before-ready")) as s, \
                    AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
                for kwargs, field in (({"prompt": "hi"}, "prompt"),
                                      ({"messages": CAPITAL}, "messages")):
                    with pytest.raises(WarmgateRpcError) as info:
                        await collect(c, **kwargs)
                    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
                    [violation] = info.value.field_violations
                    assert violation.subject == field
                    assert "has no tokenizer.json" in violation.description
                    if flags[1] != "tiny":
                        assert str(tmp_path) in violation.description
                await eventually(lambda: s.controller.model_loaded, 60)
                got, texts = await collect(c, [1, 2, 3], max_tokens=3)
                # No text to give; one message per step, and a slow reader's tokens coalesce.
                assert len(got.token_ids) == 3 and texts and set(texts) == {""}

    run(body(), 120)


def first_token_once(tokens: list[int], start: int) -> int:
    """The index, from `start`, of the first token that does not occur earlier."""
    return next(i for i in range(start, len(tokens)) if tokens.index(tokens[i]) == i)


@pytest.mark.parametrize("k", [0, 3])
def test_generation_stops_at_the_models_eos_unless_ignore_eos(tmp_path: Path, k: int) -> None:
    write_tiny_model(tmp_path)
    config = server_config("--model", str(tmp_path), "--num-speculative-steps", str(k))
    # The tiny model's greedy run falls into a cycle; a prompt that already holds one turn of
    # it lets the n-gram drafter propose the next turn, so with k=3 the EOS comes as an
    # accepted draft, with an accepted draft and the bonus token after it in the same step.
    reference = ModelRunner(config.runner)
    warmup_run = reference_greedy(reference, [5, 6, 7, 5, 6, 7, 5, 6], 24)
    prompt_ids = [5, 6, 7, 5, 6, 7, 5, 6, *warmup_run[:16]]
    free_run = reference_greedy(reference, prompt_ids, 16)
    stop_at = first_token_once(free_run, 3)
    eos = free_run[stop_at]
    (tmp_path / "generation_config.json").write_text(f'{{"eos_token_id": [{eos}]}}')

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            got, _ = await collect(c, prompt_ids, max_tokens=16)
            assert got.token_ids == free_run[:stop_at + 1]  # nothing after the EOS
            assert got.finish_reason == "stop"
            assert got.usage is not None and got.usage.completion_tokens == stop_at + 1
            if k:  # every token after the prefill's came as an accepted draft
                assert got.usage.num_accepted_draft_tokens == stop_at
            ignoring, _ = await collect(c, prompt_ids, max_tokens=16, ignore_eos=True)
            assert ignoring.token_ids == free_run and ignoring.finish_reason == "length"
            # The caller's stop ids still apply with ignore_eos.
            stop = free_run[first_token_once(free_run, stop_at + 1)]
            own, _ = await collect(c, prompt_ids, max_tokens=16, ignore_eos=True,
                                   stop_token_ids=[stop])
            assert own.token_ids == free_run[:free_run.index(stop) + 1]
            assert own.finish_reason == "stop"

    run(body(), 180)


def test_cli_streams_text_for_chat_and_prompt_and_ids_for_prompt_ids(model_dir: Path) -> None:
    config = server_config("--model", str(model_dir))
    with ServerThread(config) as server:
        server.call(server.running.controller.warmup_kernels())
        target = ["--target", server.target]
        texts = []
        for option, value in (("--chat", CAPITAL[0]["content"]), ("--prompt", "Hello")):
            out, err = io.StringIO(), io.StringIO()
            assert cli.main([*target, "generate", option, value, "--max-tokens", "5"],
                            out=out, err=err) == 0
            texts.append(out.getvalue())
            assert "5 tokens, finish length" in err.getvalue()
        chat_ids = reference_ids(model_dir, messages=CAPITAL)
        expected = reference_greedy(ModelRunner(config.runner), chat_ids, 5)
        assert texts[0] == decode(model_dir, expected) + "\n"
        out = io.StringIO()
        assert cli.main([*target, "--json", "generate", "--chat", CAPITAL[0]["content"],
                         "--max-tokens", "5"], out=out, err=io.StringIO()) == 0
        assert json.loads(out.getvalue())["text"] == texts[0].removesuffix("\n")
        out = io.StringIO()
        ids = ",".join(map(str, chat_ids))
        assert cli.main([*target, "generate", "--prompt-ids", ids, "--max-tokens", "5",
                         "--ignore-eos"], out=out, err=io.StringIO()) == 0
        assert out.getvalue() == ",".join(map(str, expected)) + "\n"


@pytest.mark.slow
def test_smollm2_answers_the_capital_question_with_paris() -> None:
    """The real checkpoint through its chat template, greedy, until its EOS (<|im_end|>)."""
    directory = smollm2_dir()
    config = server_config("--model", str(directory), "--max-model-len", "256",
                           "--max-num-seqs", "2", "--serve-before-ready")

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await eventually(lambda: s.controller.model_loaded, 300)
            got, _ = await collect(c, messages=CAPITAL, max_tokens=48)
            assert "Paris" in got.text, got.text
            assert got.finish_reason == "stop" and got.token_ids[-1] == 2  # <|im_end|>

    run(body(), 600)
