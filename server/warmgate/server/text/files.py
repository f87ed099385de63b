"""Reading the model directory's JSON files, with load errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from warmgate.server.config.json_text import JsonTooDeep, parse_json
from warmgate.server.text.errors import TextLoadError

# The model directory's tokenizer; its absence means token ids only (and no tokenizers,
# no jinja2 imported: text.model_text loads text.tokenizer only when the file is there).
TOKENIZER_FILE = "tokenizer.json"


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; TextLoadError naming the file if it is not one."""
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TextLoadError(path, f"cannot be read ({exc})") from None
    except (json.JSONDecodeError, JsonTooDeep) as exc:
        raise TextLoadError(path, f"is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TextLoadError(path, f"holds a JSON {type(data).__name__}, not an object")
    return data
