"""What a request asks its output to match, and the error a grammar that cannot be used is."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from warmgate.server.text.model_text import ModelText

GrammarKind = Literal["json_schema", "regex", "ebnf"]
GRAMMAR_KINDS: tuple[GrammarKind, ...] = ("json_schema", "regex", "ebnf")
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: " and sometimes a
# "Check failed: (...) is false: " before the sentence a caller can act on.
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")
_CHECK_FAILED = re.compile(r"^Check failed: \(.*?\) is false:\s*")
MAX_MESSAGE_CHARS = 300
ALL_ALLOWED = -1  # a bitmask word with every bit set


@dataclass(frozen=True)
class GrammarSpec:
    """One request's grammar: its kind (the request field it came in) and its text; the
    compiled grammar is cached under the whole spec."""

    kind: GrammarKind
    text: str
    # JSON schemas only: allow free whitespace between elements (off: compact one-line JSON,
    # the separators json.dumps writes). The server's --grammar-json-whitespace.
    json_whitespace: bool = False

    @property
    def field(self) -> str:
        return f"sampling.{self.kind}"


class GrammarViolation(RuntimeError):
    """A produced token the request's grammar does not accept: its bitmask was not applied
    (a bug). The request ends with this error; the others in its steps carry on."""


class GrammarDeadEnd(GrammarViolation):
    """The grammar allows no token after the output so far: it admits no string that starts
    with it (a dead branch, such as `a[^\\s\\S]`). The request's grammar is unusable, which
    is the request's error (INVALID_ARGUMENT naming `field`), not the server's."""

    def __init__(self, field: str, num_tokens: int) -> None:
        super().__init__(f"{field}: the grammar allows no token after the {num_tokens} "
                         "tokens produced: no string it admits starts with them")
        self.field = field
        self.message = str(self).removeprefix(f"{field}: ")


class GrammarTimeout(Exception):
    """The grammar did not compile within the server's budget (RESOURCE_EXHAUSTED)."""

    def __init__(self, field: str, budget_s: float) -> None:
        super().__init__(f"{field}: not compiled within the server's {budget_s:g} s grammar "
                         "compile budget (--grammar-compile-timeout); simplify the grammar")
        self.field = field


class GrammarError(ValueError):
    """A grammar that cannot be used: `field` names the request field, `message` says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def one_line(exc: BaseException) -> str:
    """xgrammar's message on one line, without its source-file prefix."""
    text = " ".join(str(exc).split())
    text = _CHECK_FAILED.sub("", _CPP_PREFIX.sub("", text))
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS - 3] + "..."
    return text or type(exc).__name__


def grammar_unavailable_reason(text: ModelText) -> str | None:
    """Why this model cannot take a grammar request, or None when it can."""
    if text.tokenizer is None:
        return ("structured output needs the model's tokenizer (tokenizer.json in the model "
                "directory); this model has none")
    if not text.eos_token_ids:
        return ("structured output needs the model's end-of-sequence ids (eos_token_id in "
                "generation_config.json or config.json) to end a grammar on; this model has "
                "none")
    return None
