"""Run one of the sm_90 compile probes (tests/sm90_compile.py) as its own program, without
TRITON_INTERPRET (its kernels must be defined for the GPU), and read its JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_probe(module: str, timeout_s: float = 300) -> list[dict[str, Any]]:
    """`python -m <module>` from the repository root: one dict per line it printed. The probe
    failing fails the calling test with its stderr."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(str(ROOT / p) for p in ("", "client", "server"))
    proc = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]
