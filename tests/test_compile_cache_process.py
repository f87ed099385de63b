"""--cache-dir end to end: `--warmup-only` processes (concurrent, cold then warm) and a
server that finds a damaged entry, rebuilds it and still turns ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf import json_format

from warmgate.client import cache_fs, render
from warmgate.client.api import WaitResult, WarmgateClient
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.v1 import warmup_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
# Small batch limits keep --compile's bucket list (and its cold compile) short on a CPU: 1 and
# 2 tokens, the fewest buckets the warmup takes; a hit or a miss is the same per bucket.
SMALL = ["--max-num-seqs", "1", "--max-num-batched-tokens", "2"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                        "FLASHINFER_WORKSPACE_BASE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    return env


def _warmup_only(cache_dir: Path, *flags: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "warmgate.server.main", "--warmup-only", "--json",
            "--device", "cpu", "--metrics-port", "-1", "--cache-dir", str(cache_dir), *flags]
    return subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _report(proc: subprocess.Popen[str]) -> tuple[pb.WarmupReport, float]:
    """The printed report, parsed strictly as the CLI's schema (an unknown field fails)."""
    start = time.monotonic()
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json_format.Parse(out, pb.WarmupReport()), time.monotonic() - start


def _only_entry(cache_dir: Path) -> Path:
    entries = [p for p in cache_dir.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1, entries
    return entries[0]


def test_two_warmup_only_processes_at_once_share_one_consistent_entry(tmp_path: Path) -> None:
    procs = [_warmup_only(tmp_path, *SMALL) for _ in range(2)]
    reports = [_report(p)[0] for p in procs]
    assert all(r.outcome == pb.WARMUP_OUTCOME_SUCCEEDED for r in reports)
    # The fill lock orders them: one filled the entry, the other found it READY.
    assert sorted(r.compile_cache.state for r in reports) == ["hit", "miss"]
    assert len({r.compile_cache.key for r in reports}) == 1
    entry = _only_entry(tmp_path)
    assert cache_fs.check_entry(entry, reports[0].compile_cache.key) is None
    assert not (tmp_path / ".trash").exists()
    ready = json.loads((entry / "READY").read_text())
    assert ready["warmup_seconds"] > 0 and ready["warmgate_version"]


def _simulate_filled_file(entry: Path) -> Path:
    """A cached kernel, recorded in the manifest as a real fill would have recorded it."""
    kernel = entry / "triton" / "abc" / "kernel.so"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(os.urandom(8192))
    cache_fs.atomic_write_json(entry / "MANIFEST.json", cache_fs.build_manifest(entry))
    ready = json.loads((entry / "READY").read_text())
    ready["manifest_sha256"] = cache_fs.file_sha256(entry / "MANIFEST.json")
    cache_fs.atomic_write_json(entry / "READY", ready)
    return kernel


def test_a_truncated_cache_file_is_rebuilt_and_the_server_still_turns_ready(
        tmp_path: Path) -> None:
    first, _ = _report(_warmup_only(tmp_path))
    entry = _only_entry(tmp_path)
    kernel = _simulate_filled_file(entry)
    assert cache_fs.check_entry(entry) is None
    with open(kernel, "r+b") as f:
        f.truncate(100)  # a pod killed mid-write, a full disk
    assert "truncated" in (cache_fs.check_entry(entry) or "")
    with ServerProcess(["--cache-dir", str(tmp_path)], _env()) as p, \
            WarmgateClient(f"127.0.0.1:{p.port}", timeout=60) as client:
        assert client.wait_ready(60) is WaitResult.READY, p.log()
        status = client.get_status()
        log = p.log()
    text = render.status_text(status)
    assert "compile cache: rebuilt key=" in text and f"dir={tmp_path}" in text
    cache = status.compile_cache
    assert cache.state == "rebuilt" and "truncated" in cache.detail
    assert cache.key == first.compile_cache.key and cache.directory == str(tmp_path)
    assert cache.size_bytes > 0
    assert status.last_report.compile_cache.state == "rebuilt"
    assert "moved to" in log and "rebuilding" in log
    assert len(list((tmp_path / ".trash").iterdir())) == 1
    assert cache_fs.check_entry(entry, cache.key) is None  # READY again, new manifest


@pytest.mark.slow
def test_second_warmup_only_hits_the_cache_with_compile(tmp_path: Path) -> None:
    """--compile is what compiles on a CPU: inductor's FX graphs land in the entry."""
    cold, cold_s = _report(_warmup_only(tmp_path, "--compile", *SMALL))
    warm, warm_s = _report(_warmup_only(tmp_path, "--compile", *SMALL))
    print(f"\n--warmup-only --compile: cold {render.seconds(cold.total_duration):.2f} s "
          f"(process {cold_s:.2f} s), warm {render.seconds(warm.total_duration):.2f} s "
          f"(process {warm_s:.2f} s)")
    assert cold.compile_cache.state == "miss"
    assert warm.compile_cache.state == "hit"
    cold_compile = next(p for p in cold.phases if p.name == "compile")
    warm_compile = next(p for p in warm.phases if p.name == "compile")
    assert cold_compile.status == pb.PHASE_STATUS_RAN and cold_compile.cache_misses > 0
    assert warm_compile.cache_hits == cold_compile.cache_misses
    assert warm_compile.cache_misses == 0
    # shapes values are JSON text in the proto (a string map).
    assert any(p.shapes.get("compile_cache") == '"hit"' for p in warm.phases)
    entry = _only_entry(tmp_path)
    manifest = json.loads((entry / "MANIFEST.json").read_text())
    assert any(name.startswith("inductor/") for name in manifest["files"])
