"""The model's end-of-sequence ids: generation_config.json's eos_token_id, else config.json's;
an int or a list of ints.

Where both files set one and they differ, generation_config.json's wins, as in transformers'
generate. Where generation_config.json exists but sets none, transformers stops at no EOS at
all; warmgate uses config.json's instead (the model's declared end of sequence) and logs it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from warmgate.server.text.errors import TextLoadError
from warmgate.server.text.files import read_json_object

logger = logging.getLogger(__name__)

EOS_SOURCES = ("generation_config.json", "config.json")
EOS_KEY = "eos_token_id"
# Models end their sequences with one to a handful of ids; each is checked per generated
# token, and listed in the start-up log. 49,152 ids (a whole vocabulary) made one 333 KB log
# line: past this many the file is refused.
MAX_EOS_TOKEN_IDS = 64
# What a log line shows of a value the server does not use.
MAX_LOGGED_CHARS = 200


def read_eos_token_ids(directory: Path, vocab_size: int) -> tuple[tuple[int, ...], str | None]:
    """(the ids, the file they came from); ((), None) when neither file sets any."""
    values: dict[str, object] = {}
    for name in EOS_SOURCES:
        path = directory / name
        if path.is_file():
            values[name] = read_json_object(path).get(EOS_KEY)
    found = [name for name, value in values.items() if value is not None]
    if not found:
        return (), None
    source = found[0]
    ids = _checked_ids(directory / source, values[source], vocab_size)
    # The file that lost is only read, not checked: the reference never uses it either.
    for name in found[1:]:
        other = values[name]
        listed = other if isinstance(other, list) else [other]
        if not (all(isinstance(v, int) for v in listed) and set(listed) == set(ids)):
            logger.warning("EOS ids: %s's %s win over %s's %s, as in transformers' generate",
                           source, list(ids), name, _short(other))
    if source != EOS_SOURCES[0] and EOS_SOURCES[0] in values:
        logger.warning("EOS ids: %s sets no %s, so %s's %s are used (transformers' generate "
                       "would stop at none)", EOS_SOURCES[0], EOS_KEY, source, list(ids))
    return ids, source


def _checked_ids(path: Path, value: object, vocab_size: int) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    # bool is an int in Python; true/false as a token id is a broken file, not id 1/0.
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TextLoadError(path, f"{EOS_KEY}: {_short(value)} is not a token id or a list of "
                                  "them")
    if len(values) > MAX_EOS_TOKEN_IDS:
        raise TextLoadError(path, f"{EOS_KEY}: {len(values)} ids, at most {MAX_EOS_TOKEN_IDS} "
                                  "(a model ends its sequences with a few)")
    outside = [v for v in values if not 0 <= v < vocab_size]
    if outside:
        raise TextLoadError(path, f"{EOS_KEY}: {outside} outside the vocabulary "
                                  f"[0, {vocab_size})")
    return tuple(dict.fromkeys(values))


def _short(value: object) -> str:
    """repr(value), cut to a log line's share."""
    text = repr(value)
    if len(text) <= MAX_LOGGED_CHARS:
        return text
    size = f", {len(value)} items" if isinstance(value, list) else ""
    return f"{text[:MAX_LOGGED_CHARS]}... ({len(text)} characters{size})"
