"""Run a bench script as a user runs it: `python bench/x.py ...` from the repository root in
a subprocess, with the import path a `pip install -e` checkout gives (client/ and server/,
never the repository root), so a script that needs more than the installed package fails
here as it would for them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def user_env() -> dict[str, str]:
    """The environment after the Quick start's editable install: its .pth puts client/ and
    server/ on sys.path, nothing else of the checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    return env


def run_bench(command: str, args: Sequence[str] = (), timeout: float = 240.0
              ) -> subprocess.CompletedProcess[str]:
    """`python <command> <args>` from the repository root, command as README shows it
    (`bench/warm.py coverage`); stdout and stderr captured."""
    return subprocess.run([sys.executable, *command.split(), *args], cwd=ROOT, env=user_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def load_script(relative: str) -> ModuleType:
    """A script of the repository (bench/x.py, tools/y.py) imported from its path, for tests
    of its functions. Its folder leads sys.path while it imports, as when Python runs it, so
    its imports of the scripts beside it resolve."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered as an import would be: dataclasses look their module up there.
    sys.modules[spec.name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
