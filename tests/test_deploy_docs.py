"""The deployment docs describe the server as it is: no flag the server has is called planned
or missing, and every warmgate-server flag they name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from warmgate.server.server_config import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "deploy" / "README.md", *sorted((ROOT / "deploy").rglob("*.yaml"))]
FUTURE = re.compile(r"\b(planned|not yet in the server|will serve|to come)\b", re.I)


def server_flags() -> set[str]:
    return {opt for action in build_parser({})._actions for opt in action.option_strings
            if opt.startswith("--")}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_existing_flag_is_described_as_future(path: Path) -> None:
    flags = server_flags()
    # Paragraphs, so a sentence broken over lines is read whole.
    for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
        if FUTURE.search(paragraph):
            named = set(re.findall(r"--[a-z][a-z0-9-]+", paragraph)) & flags
            assert not named, f"{path.name}: {sorted(named)} exist but read as future: " \
                              f"{paragraph.strip()[:200]}"
