"""The one error a model directory that cannot be served raises, in its own module so the
config.json reader and the safetensors header reader can both raise it without importing
each other."""

from __future__ import annotations

from pathlib import Path


class ModelLoadError(ValueError):
    """A model directory cannot be served as its reference would run it: the message is one
    line naming the file and the key (config entry or tensor name)."""

    def __init__(self, path: str | Path, key: str, message: str) -> None:
        super().__init__(f"{path}: {key}: {message}")
        self.path = str(path)
        self.key = key
        self.message = message
