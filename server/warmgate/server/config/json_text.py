"""JSON from the files start-up reads (config.json, generation_config.json,
tokenizer_config.json, a safetensors header), parsed with one promise more than json.loads:
a document nested deeper than the parser's recursion allows is a ValueError saying so.

json.loads raises RecursionError there, a RuntimeError no reader's `except ValueError`
catches: a config.json holding `[[[[...]]]]` 100,000 deep ended the start-up with a
traceback and exit 1 instead of one line naming the file.
"""

from __future__ import annotations

import json
from typing import Any


class JsonTooDeep(ValueError):
    """The document nests arrays or objects deeper than the parser can follow."""


def parse_json(text: str | bytes) -> Any:
    """json.loads(text); JsonTooDeep for a document nested too deeply to parse (any other
    malformed document stays json.JSONDecodeError, also a ValueError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonTooDeep("nested deeper than a JSON reader follows (arrays or objects inside "
                          "each other thousands deep): a broken or hostile file") from None
