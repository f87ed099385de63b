"""PEP 561: each shipped package says it is typed, so mypy users get the generated .pyi stubs
and the clients' hints. `warmgate` is a namespace package (client/ and server/ both hold
part of it), so the marker goes in each subpackage rather than at the root."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["warmgate.client", "warmgate.v1", "warmgate.server"])
def test_every_package_ships_py_typed(package: str) -> None:
    module = importlib.import_module(package)
    marker = Path(next(iter(module.__path__))) / "py.typed"
    assert marker.is_file(), f"{package} has no py.typed"
    # The wheel takes the package directories as they are, minus what git ignores.
    ignored = subprocess.run(["git", "check-ignore", "-q", str(marker)], cwd=ROOT,
                             check=False).returncode == 0
    assert not ignored
