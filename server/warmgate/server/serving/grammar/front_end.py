"""A GrammarSpec to xgrammar: its parsed Grammar, the reasons to refuse it before compiling
(a schema keyword xgrammar would not enforce, a grammar that admits no string) and after (no
token can start it), and the compile. The checks run in the probe (probe_worker.py), the
compile also where the grammar is served."""

from __future__ import annotations

import xgrammar as xgr

from warmgate.server.serving.grammar.emptiness import NestedTooDeep, admits_no_string
from warmgate.server.serving.grammar.schema_checks import unenforced_schema_reason
from warmgate.server.serving.grammar.schema_rewrite import enforceable_schema
from warmgate.server.serving.grammar.spec import GrammarError, GrammarSpec, one_line

# Whitespace characters allowed between two JSON elements when free whitespace is on
# (xgrammar's max_whitespace_cnt): unbounded, a model that keeps choosing whitespace inside
# an object never closes it and runs to max_tokens. 20 is a newline and nine levels of
# two-space indentation.
MAX_JSON_WHITESPACE = 20


def parse(spec: GrammarSpec) -> xgr.Grammar:
    """The spec's Grammar; GrammarError with xgrammar's message when the text is not a valid
    grammar of its kind."""
    try:
        if spec.kind == "json_schema":
            return xgr.Grammar.from_json_schema(
                enforceable_schema(spec.text), any_whitespace=spec.json_whitespace,
                max_whitespace_cnt=MAX_JSON_WHITESPACE if spec.json_whitespace else None)
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.text)
        return xgr.Grammar.from_ebnf(spec.text)
    except Exception as exc:  # xgrammar raises RuntimeError (C++) or ValueError
        raise GrammarError(spec.field, f"not a valid {spec.kind}: {one_line(exc)}") from None


def check_text(spec: GrammarSpec) -> None:
    """GrammarError for a schema keyword xgrammar would accept without enforcing it (checked
    before parsing, which would log xgrammar's own warning about it)."""
    if spec.kind == "json_schema":
        reason = unenforced_schema_reason(spec.text)
        if reason is not None:
            raise GrammarError(spec.field, reason)


def check_grammar(spec: GrammarSpec, grammar: xgr.Grammar) -> None:
    """GrammarError when the parsed grammar admits no string at all, or nests too deeply
    to tell."""
    try:
        empty = admits_no_string(grammar.serialize_json())
    except NestedTooDeep:
        raise GrammarError(spec.field, f"the {spec.kind} nests too deeply for the server to "
                           "check that some output matches it; flatten it") from None
    if empty:
        raise GrammarError(spec.field, f"the {spec.kind} admits no string at all, so no "
                           "output can match it")


def check_compiled(spec: GrammarSpec, compiled: xgr.CompiledGrammar) -> None:
    """GrammarError when no token of the vocabulary can start the compiled grammar (a
    grammar that admits only strings no token sequence spells)."""
    matcher = xgr.GrammarMatcher(compiled)
    if matcher.is_terminated():
        return
    bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    if not bool(bitmask.any()):
        raise GrammarError(spec.field, f"no output can match the {spec.kind}: no token of "
                           "the model's vocabulary can start it")


def compile_grammar(compiler: xgr.GrammarCompiler, spec: GrammarSpec) -> xgr.CompiledGrammar:
    grammar = parse(spec)
    try:
        return compiler.compile_grammar(grammar)
    except Exception as exc:
        raise GrammarError(spec.field, f"not a valid {spec.kind}: {one_line(exc)}") from None
