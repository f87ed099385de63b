"""Just before health turns SERVING, the Generate service's grammar side looks for the grammar
backend the warmup built, to start the compile probes (api/grammar_requests.py). A model that
cannot take a grammar request has none, and looking imported xgrammar in the server's process:
a second of imports before SERVING on every start of such a model."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from warmgate.server.api.grammar_requests import GrammarRequests
from warmgate.server.config.serving_config import ServingConfig
from warmgate.server.text.model_text import ModelText

BACKEND_MODULE = "warmgate.server.serving.grammar.backend"  # imports xgrammar
VOCAB = 512
# What grammar_unavailable_reason reads of a tokenizer: that there is one.
A_TOKENIZER: Any = object()


def _looked_up(monkeypatch: pytest.MonkeyPatch, text: ModelText) -> list[ModelText]:
    """The texts prepare() asked the backend module about, with a stand-in module in its
    place (no backend built)."""
    asked: list[ModelText] = []
    stand_in = SimpleNamespace(built_backend=lambda t, _vocab: asked.append(t))
    monkeypatch.setitem(sys.modules, BACKEND_MODULE, stand_in)
    GrammarRequests(text, VOCAB, ServingConfig()).prepare()
    return asked


@pytest.mark.parametrize("text", [ModelText(), ModelText(tokenizer=A_TOKENIZER)],
                         ids=["no tokenizer", "no EOS ids"])
def test_a_model_that_takes_no_grammar_does_not_look_for_a_backend(
        monkeypatch: pytest.MonkeyPatch, text: ModelText) -> None:
    assert _looked_up(monkeypatch, text) == []


def test_a_model_that_takes_grammars_looks_for_the_warmups_backend(
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = ModelText(eos_token_ids=(2,), tokenizer=A_TOKENIZER)
    assert _looked_up(monkeypatch, text) == [text]
