"""kernels/triton_key.py: Triton's cache key computed on a background thread that imports
nothing (the packages the key walks are imported before it starts), in a fresh process, since
the key is cached per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from triton.runtime import cache
from warmgate.server.kernels.triton_key import start_triton_key
assert cache.triton_key.cache_info().currsize == 0
thread = start_triton_key()
before = set(sys.modules)
thread.join(120)
after = set(sys.modules)
key = cache.triton_key()
print(json.dumps({"daemon": thread.daemon, "cached": cache.triton_key.cache_info().currsize,
                  "hits": cache.triton_key.cache_info().hits,
                  "imported_by_the_thread": sorted(after - before),
                  "again": start_triton_key() is None, "key_starts": key[:20]}))
"""


def test_the_key_is_computed_in_the_background_without_imports() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "client"),
                                                        str(ROOT / "server")])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    import triton

    assert out["daemon"] and out["cached"] == 1 and out["again"]
    # The later call (as a kernel's compile makes) was a cache hit: the thread's result.
    assert out["hits"] == 1 and out["key_starts"].startswith(triton.__version__)
    assert out["imported_by_the_thread"] == []
