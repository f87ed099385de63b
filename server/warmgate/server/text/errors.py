"""Errors of the text layer: one at load time (a file of the model directory), one per
request (the request's prompt)."""

from __future__ import annotations

from pathlib import Path


class TextLoadError(ValueError):
    """A tokenizer, chat template or EOS file of the model directory cannot be used. The
    message is one line that names the file (and key); the server cannot start with it."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)


class PromptError(ValueError):
    """A request's prompt cannot be turned into token ids; `fields` are the request fields at
    fault (more than one when they contradict each other)."""

    def __init__(self, fields: str | tuple[str, ...], message: str) -> None:
        self.fields = (fields,) if isinstance(fields, str) else fields
        super().__init__(f"{', '.join(self.fields)}: {message}")
        self.message = message


class RenderBusy(Exception):
    """The chat template's workers are all busy and its queue full: the request is refused
    (RESOURCE_EXHAUSTED), not queued without bound."""


class RenderCancelled(Exception):
    """The request was cancelled before its chat template render ended: nothing to answer."""

    def __init__(self) -> None:
        super().__init__("the request was cancelled")
