"""The model directory's chat template, rendered as transformers' apply_chat_template renders
it: a sandboxed, immutable jinja2 environment with the same options, filters and globals, and
the tokenizer's named special tokens (bos_token, eos_token, ...) in the context.

The template is code from the checkpoint's author: the sandbox keeps it from reaching Python
internals, and the immutable environment from changing the objects passed in. It is compiled
and rendered only in a worker process (text.template_worker), which bounds its time and
memory; the sandbox (text.template_sandbox) and the render below bound its output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser

from warmgate.server.text.errors import PromptError, TextLoadError
from warmgate.server.text.template_sandbox import BoundedSandbox, RenderBoundError

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_KEY = "chat_template"
# The named special tokens transformers passes to every template (its special_tokens_map).
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token")
# What a template's own failure (raise_exception, a bad index on odd messages) looks like.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError,
                  AttributeError)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`, which transformers' templates may use to mark
    the assistant's text for training masks: rendered as its body, as transformers does when
    it does not track them."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja2's own tojson escapes HTML characters, which would change the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` in a template, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja2's namespace(), refusing underscore names (a way towards Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template cannot set underscore attributes on a namespace: {name!r}")


def _environment(max_chars: int) -> BoundedSandbox:
    env = BoundedSandbox(max_chars, trim_blocks=True, lstrip_blocks=True,
                         extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_TemplateDict(), namespace=_TemplateNamespace)
    return env


def _special_token(path: Path, key: str, value: object) -> str | None:
    """A tokenizer_config.json special token: a string, or an AddedToken's {"content": ...}."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TextLoadError(path, f"{key}: {value!r} is neither a string nor a token with a "
                              "\"content\" string")


def special_tokens_of(tokenizer_config: Mapping[str, Any], path: Path) -> dict[str, str]:
    tokens = {key: _special_token(path, key, tokenizer_config.get(key))
              for key in SPECIAL_TOKEN_KEYS}
    return {key: value for key, value in tokens.items() if value is not None}


def template_source(directory: Path, tokenizer_config: Mapping[str, Any]
                     ) -> tuple[str, str] | None:
    """(template text, where it came from), or None when the directory has none."""
    path = directory / TEMPLATE_FILE
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise TextLoadError(path, f"cannot be read ({exc})") from None
    value = tokenizer_config.get(TEMPLATE_KEY)
    origin = f"{directory / TOKENIZER_CONFIG_FILE}: {TEMPLATE_KEY}"
    if value is None:
        return None
    if isinstance(value, str):
        return value, origin
    # transformers also writes a list of named templates; "default" is the chat one.
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return str(named["default"]), f"{origin} (\"default\")"
    raise TextLoadError(directory / TOKENIZER_CONFIG_FILE,
                        f"{TEMPLATE_KEY}: neither a template string nor a list of named "
                        "templates with a \"default\" one")


class ChatTemplate:
    """A compiled chat template and the special tokens its context gets; a render longer
    than `max_chars` characters stops there (RenderBoundError)."""

    def __init__(self, source: str, origin: str, special_tokens: Mapping[str, str],
                 max_chars: int) -> None:
        self.origin = origin
        self.max_chars = max_chars
        self._special_tokens = dict(special_tokens)
        try:
            self._template = _environment(max_chars).from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TextLoadError(origin, f"not a valid jinja2 template (line {exc.lineno}: "
                                        f"{exc.message})") from None

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text for `messages`, ending with the assistant's generation prompt."""
        # Counted as the chunks come, so an endless output stops at the bound, not at the
        # memory limit.
        chunks, num_chars = [], 0
        try:
            for chunk in self._template.generate(
                    messages=[dict(m) for m in messages], tools=None, documents=None,
                    add_generation_prompt=True, **self._special_tokens):
                num_chars += len(chunk)
                if num_chars > self.max_chars:
                    raise RenderBoundError("output", f"the rendered prompt passed "
                                           f"{self.max_chars} characters")
                chunks.append(chunk)
            return "".join(chunks)
        except _RENDER_ERRORS as exc:
            raise PromptError("messages", f"{type(exc).__name__}: {exc}") from None
