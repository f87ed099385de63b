"""What the config.json reader decided where the model directory says two things (or says
something the reference does not apply). The reader runs at start-up, before logging is set
up, and more than once; the load phase logs the notes, once, next to the model's line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigNote:
    # The config.json key (or tensor) the decision is about.
    key: str
    text: str
    # A key that was ignored although it says something else: the file contradicts itself.
    warning: bool = False


def note(notes: list[ConfigNote] | None, key: str, text: str, *, warning: bool = False
         ) -> None:
    """Record a decision when the caller collects them (None: nobody asked)."""
    if notes is not None:
        notes.append(ConfigNote(key, text, warning))
