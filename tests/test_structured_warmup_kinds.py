"""The structured phase compiles a grammar of every kind a request can send (JSON schema,
regex, EBNF) before ready, so the first request of a kind does not take its front end's first
run after ready."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.runner_helpers import make_runner
from tests.text_helpers import write_tiny_model
from warmgate.server.core.results import PhaseStatus
from warmgate.server.serving.grammar.backend import grammar_backend
from warmgate.server.text.model_text import load_model_text
from warmgate.server.warmup.structured import (
    WARMUP_OTHER_KINDS,
    run_structured_warmup,
)

EOS = 2


def test_every_grammar_kind_is_compiled_before_ready(tmp_path: Path) -> None:
    directory = write_tiny_model(tmp_path, eos_token_id=EOS)
    runner = make_runner()
    text = load_model_text(dataclasses.replace(runner.config.model,
                                               weights_path=str(directory)))
    phase = run_structured_warmup(runner, runner.execute_model, runner.sample_tokens,
                                  text=text)
    assert phase.status is PhaseStatus.RAN, phase.detail
    assert phase.shapes["grammar_kinds"] == ["json_schema", "regex", "ebnf"]
    assert {g.kind for g in WARMUP_OTHER_KINDS} == {"regex", "ebnf"}
    # The phase built the model's backend and compiled one grammar of each kind with it.
    backend = grammar_backend(text, runner.config.model.vocab_size)
    assert backend.num_compiles == 1 + len(WARMUP_OTHER_KINDS)
