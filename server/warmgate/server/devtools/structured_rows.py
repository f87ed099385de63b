"""Structured output in the coverage workload, through the real grammar path: a random share of
the requests get a grammar (a JSON schema, a regex or an EBNF grammar, drawn at random) and an
xgrammar matcher of their own, as a Generate request with one would. Every step, each such
request that samples gets its bitmask rows filled by its matcher (1 + its drafts, with the
same accept-and-roll-back the serving loop does), the runner applies them, and the tokens the
step produced are accepted by the matcher: a token the grammar forbids is a violation (the
bitmask did not constrain the row). A request whose grammar completed (it accepted the EOS) is
finished, and its text, decoded with the model's tokenizer, must parse as its grammar says.
Models without a tokenizer (or EOS ids) cannot take grammars; the workload then runs without.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from warmgate.server.devtools.batch_driver import BatchDriver, DrivenRequest
from warmgate.server.runner.scheduler_output import GrammarOutput, SchedulerOutput
from warmgate.server.serving.grammar.spec import (
    ALL_ALLOWED,
    GrammarKind,
    GrammarSpec,
    GrammarViolation,
    grammar_unavailable_reason,
)
from warmgate.server.text.model_text import load_model_text

CONSTRAINED_SHARE = 0.3
# Tokens a constrained request may produce (its drawn max_new_tokens is raised to this, within
# the model length), so that random weights, which often choose the whitespace JSON allows,
# complete some grammars.
GRAMMAR_MAX_NEW = 96
MAX_FAILURES_SHOWN = 5


def _json_ok(text: str) -> bool:
    value = json.loads(text)
    return (isinstance(value, dict) and set(value) == {"ok", "kind"}
            and isinstance(value["ok"], bool) and value["kind"] in ("a", "b"))


REGEX = r"(yes|no), [0-9]{2}!"
EBNF = ('root ::= "[" item ("," item)? ("," item)? "]"\n'
        'item ::= "red" | "green" | "blue" | [0-9]')
# The language of EBNF, as a regex, to check its outputs with.
EBNF_AS_REGEX = r"\[(red|green|blue|[0-9])(,(red|green|blue|[0-9])){0,2}\]"


@dataclass(frozen=True)
class CheckedGrammar:
    spec: GrammarSpec
    # Whether a completed output is in the grammar's language (may raise: not).
    check: Callable[[str], bool]


GRAMMARS: dict[GrammarKind, CheckedGrammar] = {
    "json_schema": CheckedGrammar(GrammarSpec("json_schema", json.dumps({
        "type": "object", "properties": {"ok": {"type": "boolean"},
                                         "kind": {"enum": ["a", "b"]}},
        "required": ["ok", "kind"], "additionalProperties": False})), _json_ok),
    "regex": CheckedGrammar(GrammarSpec("regex", REGEX),
                            lambda text: re.fullmatch(REGEX, text) is not None),
    "ebnf": CheckedGrammar(GrammarSpec("ebnf", EBNF),
                           lambda text: re.fullmatch(EBNF_AS_REGEX, text) is not None),
}


@dataclass
class _Constrained:
    kind: GrammarKind
    grammar: Any  # serving.grammar.matcher.RequestGrammar
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    terminated: bool = False


class ConstrainedSampling:
    """Stands in for runner.execute_model and runner.sample_tokens (install()); admit() is the
    BatchDrawer's on_new_request."""

    def __init__(self, runner: Any, sched: BatchDriver, rng: random.Random,
                 share: float = CONSTRAINED_SHARE) -> None:
        self.runner, self.sched, self.rng, self.share = runner, sched, rng, share
        self._execute, self._sample = runner.execute_model, runner.sample_tokens
        text = load_model_text(runner.config.model)
        self.reason = ("a pooling model never samples" if runner.is_pooling_model
                       else grammar_unavailable_reason(text))
        self._tokenizer = text.tokenizer
        self._backend: Any = None
        if self.reason is None:
            from warmgate.server.serving.grammar.backend import grammar_backend

            self._backend = grammar_backend(text, runner.config.model.vocab_size)
        self._live: dict[str, _Constrained] = {}
        self._last: SchedulerOutput | None = None
        self.num_steps = self.num_rows = self.num_draft_rows = 0
        self.counts: Counter[str] = Counter()  # "<kind> <what>"
        self.failures: list[str] = []

    def install(self) -> ConstrainedSampling:
        if self._backend is not None:
            self.runner.execute_model = self.execute_model
            self.runner.sample_tokens = self.sample_tokens
        return self

    def admit(self, req: DrivenRequest) -> None:
        if self._backend is None or self.rng.random() >= self.share:
            return
        kind: GrammarKind = self.rng.choice(sorted(GRAMMARS))
        self._live[req.req_id] = _Constrained(kind, self._backend.matcher(GRAMMARS[kind].spec))
        self.counts[f"{kind} requests"] += 1
        # min_tokens would mask the EOS that a completed grammar allows alone (the API refuses
        # the pair).
        if req.params is not None:
            req.params = replace(req.params, min_tokens=0, stop_token_ids=())
        req.max_new_tokens = max(req.max_new_tokens, GRAMMAR_MAX_NEW)

    def execute_model(self, so: SchedulerOutput) -> Any:
        self._last = so
        return self._execute(so)

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> Any:
        rows = [(rid, len(list(group)))
                for rid, group in itertools.groupby(self.runner.last_logits_req_ids)]
        chosen = [(rid, n) for rid, n in rows if rid in self._live and not self._live[rid].done]
        if chosen:
            grammar_output = self._rows(chosen)
        out = self._sample(grammar_output)
        if out is not None and chosen:
            self._accept(out)
        self._collect()
        return out

    def _rows(self, chosen: list[tuple[str, int]]) -> GrammarOutput:
        so = self._last
        assert so is not None  # a step with logits rows came through execute_model
        total = sum(n for _, n in chosen)
        width = (self._backend.vocab_size + 31) // 32  # RequestGrammar.bitmask_width
        bitmask = torch.full((total, width), ALL_ALLOWED, dtype=torch.int32)
        start = 0
        for rid, n in chosen:
            drafts = list(so.scheduled_spec_decode_tokens.get(rid, ()))
            if len(drafts) != n - 1:
                raise AssertionError(f"{rid}: {n} logits rows for {len(drafts)} drafts")
            self._live[rid].grammar.fill_rows(bitmask, start, drafts)
            start += n
            self.num_draft_rows += n - 1
        self.num_steps += 1
        self.num_rows += total
        return GrammarOutput([rid for rid, _ in chosen], bitmask)

    def _accept(self, out: Any) -> None:
        for rid, tokens in zip(out.req_ids, out.sampled_token_ids, strict=True):
            c = self._live.get(rid)
            if c is None or c.done:
                continue
            for token in tokens:
                try:
                    c.terminated = c.grammar.accept(token)
                except GrammarViolation as exc:
                    self._fail(c, f"{rid} ({c.kind}): {exc}")
                    break
                c.tokens.append(token)
                if c.terminated:  # tokens after the EOS in this step are not the output
                    c.done = True
                    break
            if c.done:  # finished by the drawer before the next step
                self.sched.reqs[rid].max_new_tokens = 0

    def _fail(self, c: _Constrained, message: str) -> None:
        c.done = True
        self.counts[f"{c.kind} violations"] += 1
        self.failures.append(message)

    def _collect(self) -> None:
        """Check the outputs of constrained requests that left the driver."""
        for rid in [r for r in self._live if r not in self.sched.reqs]:
            self._finish(self._live.pop(rid))

    def _finish(self, c: _Constrained) -> None:
        if not c.terminated:
            self.counts[f"{c.kind} cut"] += 1  # max tokens, model length or an abort
            return
        assert self._tokenizer is not None  # a grammar needs one
        text = self._tokenizer.decode(c.tokens)
        try:
            ok = GRAMMARS[c.kind].check(text)
        except ValueError:  # json.loads
            ok = False
        self.counts[f"{c.kind} complete"] += 1
        if ok:
            self.counts[f"{c.kind} parsed"] += 1
        else:
            self.counts[f"{c.kind} unparsed"] += 1
            self.failures.append(f"{c.kind} output does not parse: {text!r}")

    def close(self) -> None:
        """Check the requests still open (call after the driver finished them all)."""
        for c in self._live.values():
            self._finish(c)
        self._live.clear()

    @property
    def ok(self) -> bool:
        return not self.failures

    def describe(self) -> str:
        if self.reason is not None:
            return f"structured rows: none ({self.reason})"
        c = self.counts
        per_kind = ", ".join(
            f"{k} {c[k + ' requests']} ({c[k + ' complete']} complete, {c[k + ' parsed']} "
            f"parse; {c[k + ' cut']} cut short; {c[k + ' violations']} violations)"
            for k in sorted(GRAMMARS))
        lines = [f"structured rows: {self.num_rows} in {self.num_steps} steps "
                 f"({self.num_draft_rows} at draft positions); constrained requests "
                 f"(~{self.share:.0%}): {per_kind}",
                 f"structured_failures: {len(self.failures)}"]
        lines += [f"  {f}" for f in self.failures[:MAX_FAILURES_SHOWN]]
        return "\n".join(lines)
