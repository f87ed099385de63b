"""The files in which the warmup keeps what it measured on the device (the MoE launches an
autotune chose, the dense linears' kernels the timing chose), apart from what each holds: a
JSON object with its format version and the GPU and library identity it was measured on,
written atomically and read back only on the same identity."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# What reading a file's own fields may raise on a file someone edited or truncated.
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError)


def read_measured(path: Path, version: int, identity: Mapping[str, str], verb: str
                  ) -> tuple[dict[str, Any] | None, str]:
    """(the file's object, "") when it is of this format and was measured on this identity;
    else (None, why not). `verb` says how it was measured ("tuned", "timed"), for the why."""
    if not path.exists():
        return None, f"no {path} yet"
    try:
        data = json.loads(path.read_text())
        found_version, found_identity = data["version"], data["identity"]
    except READ_ERRORS as exc:
        return None, unreadable(path, exc)
    if found_version != version:
        return None, f"{path} has format {found_version}, this build reads {version}"
    if found_identity != dict(identity):
        return None, f"{path} was {verb} on {found_identity}, this is {dict(identity)}"
    return data, ""


def unreadable(path: Path, exc: BaseException) -> str:
    return f"{path} is unreadable ({type(exc).__name__}: {exc})"


def write_measured(path: Path, version: int, identity: Mapping[str, str],
                   fields: Mapping[str, Any]) -> Path:
    """Write {version, identity, **fields} atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"version": version, "identity": dict(identity), **fields},
                              indent=1) + "\n")
    os.replace(tmp, path)
    return path
