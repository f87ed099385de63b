"""Structured output in the coverage workload: a random share of each step's requests sample
under a grammar bitmask (the warmup's JSON schema, in its first state), so the runner's bitmask
layout, its host-to-device copy and the apply kernel meet random batch shapes after ready.
Models without a tokenizer cannot take grammars; the workload then runs without them."""

from __future__ import annotations

import itertools
import random
from typing import Any

import torch

from warmgate.server.runner.scheduler_output import GrammarOutput
from warmgate.server.serving.grammar.spec import GrammarSpec, grammar_unavailable_reason
from warmgate.server.text.model_text import load_model_text
from warmgate.server.warmup.structured import WARMUP_SCHEMA

CONSTRAINED_SHARE = 0.3


class ConstrainedSampling:
    """Stands in for runner.sample_tokens, adding a GrammarOutput for a random share of the
    step's requests."""

    def __init__(self, runner: Any, rng: random.Random) -> None:
        self.runner = runner
        self.rng = rng
        self._sample = runner.sample_tokens
        self.num_steps = self.num_rows = 0
        text = load_model_text(runner.config.model)
        self.reason = grammar_unavailable_reason(text)
        self._row: torch.Tensor | None = None
        if self.reason is None:
            from warmgate.server.serving.grammar.backend import grammar_backend

            backend = grammar_backend(text, runner.config.model.vocab_size)
            grammar = backend.matcher(GrammarSpec("json_schema", WARMUP_SCHEMA))
            self._row = torch.empty(1, grammar.bitmask_width, dtype=torch.int32)
            grammar.fill_rows(self._row, 0, ())

    def install(self) -> ConstrainedSampling:
        if self._row is not None:
            self.runner.sample_tokens = self
        return self

    def __call__(self, grammar_output: GrammarOutput | None) -> Any:
        assert self._row is not None  # installed only with a grammar row
        rows = [(rid, len(list(group)))
                for rid, group in itertools.groupby(self.runner.last_logits_req_ids)]
        chosen = [(rid, n) for rid, n in rows if self.rng.random() < CONSTRAINED_SHARE]
        if not chosen:
            return self._sample(grammar_output)
        total = sum(n for _, n in chosen)
        self.num_steps += 1
        self.num_rows += total
        return self._sample(GrammarOutput([rid for rid, _ in chosen],
                                          self._row.expand(total, -1).contiguous()))

    def describe(self) -> str:
        if self.reason is not None:
            return f"structured rows: none ({self.reason})"
        return (f"structured rows: {self.num_rows} in {self.num_steps} steps "
                f"(~{CONSTRAINED_SHARE:.0%} of requests per step)")
