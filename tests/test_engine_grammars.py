"""Grammars with the engine process, against a live server: the model's text files are read
once, at start-up (replacing or breaking them later changes nothing a grammar request, a
chat request or a forced warmup sees), and an INTERNAL raised in the engine logs one
traceback, the engine's, with one line for it on the front. SIGTERM during the engine's
build: test_grammar_process.py."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.grpc_harness import grammar_probes_idle, run, server_config, serving
from tests.test_grpc_structured import EOS
from tests.test_grpc_text import CAPITAL, collect
from tests.text_helpers import write_tiny_model
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.v1 import warmup_pb2 as pb

TRACEBACK = "Traceback (most recent call last)"
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}


def _break_text_files(directory: Path, outside: Path) -> None:
    """tokenizer.json made a link out of the directory to a file that is no tokenizer, the
    chat template one that does not compile, generation_config.json no JSON."""
    (outside / "not-a-tokenizer.json").write_text("{not json")
    (directory / "tokenizer.json").unlink()
    os.symlink(outside / "not-a-tokenizer.json", directory / "tokenizer.json")
    (directory / "chat_template.jinja").write_text("{% for broken")
    (directory / "generation_config.json").write_text("[[[")


@pytest.mark.parametrize("engine", ["--engine-process", "--no-engine-process"])
def test_text_files_replaced_after_start_up_change_nothing_served(
        tmp_path: Path, engine: str) -> None:
    model_dir = write_tiny_model(tmp_path / "model", eos_token_id=EOS)
    config = server_config("--model", str(model_dir), engine)

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()
            await grammar_probes_idle(s)
            before, _ = await collect(c, [1, 2, 3], regex="(yes|no)", max_tokens=4)
            _break_text_files(model_dir, tmp_path)
            # New grammars (built now, in the engine when it serves) and a chat request
            # (rendered by the template loaded at start-up).
            got, _ = await collect(c, [1, 2, 3], json_schema=json.dumps(SCHEMA),
                                   max_tokens=16)
            assert got.finish_reason == "stop" and json.loads(got.text)["answer"] in (
                "yes", "no"), got
            again, _ = await collect(c, [1, 2, 3], regex="(yes|no)!", max_tokens=4)
            assert again.text == before.text + "!", (before, again)
            chat, _ = await collect(c, messages=CAPITAL, max_tokens=4, ignore_eos=True)
            assert len(chat.token_ids) == 4
            # A forced warmup's structured phase compiles on the start-up vocabulary too.
            report = await c.warmup_kernels(force=True)
            assert report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED, report

    run(body(), 180)


def test_an_internal_error_in_the_engine_logs_one_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    """A request submitted with a grammar the engine does not hold (the front's build step
    left out, as a bug would): the engine logs the traceback and marks the exception; the
    front, which ends the stream INTERNAL with it, logs one line that points there."""
    model_dir = write_tiny_model(tmp_path / "model", eos_token_id=EOS)
    config = server_config("--model", str(model_dir), "--engine-process")
    caplog.set_level(logging.ERROR)

    async def body() -> None:
        async with serving(config) as s, AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c:
            await c.warmup_kernels()

            async def built_nowhere(spec: Any, req_id: str) -> None:
                return None  # as if the engine held it

            s.generation._grammars.ready = built_nowhere  # type: ignore[method-assign]
            with pytest.raises(WarmgateRpcError) as info:
                await collect(c, [1, 2, 3], regex="(yes|no)", max_tokens=4)
            assert info.value.code is grpc.StatusCode.INTERNAL
            assert "does not hold" in info.value.message
            got, _ = await collect(c, [1, 2, 3], max_tokens=2, ignore_eos=True)
            assert len(got.token_ids) == 2  # the engine serves on

    run(body(), 180)
    engine_log = capfd.readouterr().err
    front_log = "\n".join(r.getMessage() for r in caplog.records)
    assert engine_log.count(TRACEBACK) + front_log.count(TRACEBACK) == 1, (engine_log,
                                                                          front_log)
    assert "could not be rebuilt in the engine" in engine_log
    assert "its traceback is logged above" in front_log
