"""The model's end-of-sequence ids: generation_config.json's eos_token_id, else config.json's
(as transformers' generate reads them); an int or a list of ints."""

from __future__ import annotations

from pathlib import Path

from warmgate.server.text.errors import TextLoadError
from warmgate.server.text.files import read_json_object

EOS_SOURCES = ("generation_config.json", "config.json")
EOS_KEY = "eos_token_id"


def read_eos_token_ids(directory: Path, vocab_size: int) -> tuple[tuple[int, ...], str | None]:
    """(the ids, the file they came from); ((), None) when neither file sets any."""
    for name in EOS_SOURCES:
        path = directory / name
        if not path.is_file():
            continue
        value = read_json_object(path).get(EOS_KEY)
        if value is None:
            continue
        return _checked_ids(path, value, vocab_size), name
    return (), None


def _checked_ids(path: Path, value: object, vocab_size: int) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    # bool is an int in Python; true/false as a token id is a broken file, not id 1/0.
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TextLoadError(path, f"{EOS_KEY}: {value!r} is not a token id or a list of them")
    outside = [v for v in values if not 0 <= v < vocab_size]
    if outside:
        raise TextLoadError(path, f"{EOS_KEY}: {outside} outside the vocabulary "
                                  f"[0, {vocab_size})")
    return tuple(dict.fromkeys(values))
