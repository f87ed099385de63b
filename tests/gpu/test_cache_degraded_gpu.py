"""A full cache disk mid-warmup on the GPU (issue 17.3), end to end: Triton's compiled
kernels and launcher fill a 128 KiB tmpfs under --cache-dir, the compile fails with ENOSPC,
the cache degrades to a private temporary directory and `--warmup-only` still succeeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tmpfs_helpers import mounted_tmpfs
from warmgate.server.cache import CACHE_ENV_VARS

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tmpfs", 128 * 1024) as mount:
        yield mount


def test_full_cache_disk_mid_warmup_degrades_and_warmup_succeeds(small_fs: Path) -> None:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WARMGATE_") and k not in CACHE_ENV_VARS
           and k != "TRITON_INTERPRET"}
    # Keep what the caller's path holds too (wheels installed with --target on the GPU host).
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server"),
                                         *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "warmgate.server.main", "--warmup-only", "--json", "--device",
         "cuda", "--attention-backend", "triton", "--cache-dir", str(small_fs / "cache")],
        env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    report = json.loads(done.stdout)
    cache = report["compile_cache"]
    assert cache["degraded"] is True and cache["state"] == "miss", cache
    assert "compile cache degraded" in done.stderr
    # The entry was given up: nothing READY, and its space is back.
    assert not list((small_fs / "cache").rglob("READY"))
