"""The error every configuration dataclass raises: a setting out of range or contradicting
another, named by its dotted field path (which config.flags maps back to the flag)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is out of range or contradicts another; the message names the setting."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name
        self.message = message


def _require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ConfigError(field_name, message)
