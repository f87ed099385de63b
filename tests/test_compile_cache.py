"""The compile cache's protocol on the filesystem: hit/miss/rebuilt, corruption, env, prune."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from warmgate.client import cache_fs, cli
from warmgate.client.exit_codes import EXIT_LOCAL
from warmgate.server.cache import CACHE_ENV_VARS, CompileCache, cache_key, key_inputs
from warmgate.server.config.runner_config import RunnerConfig, resolve_runner_config
from warmgate.server.runner.attention.concurrency import run_concurrently

ROOT = Path(__file__).resolve().parents[1]
INPUTS = {"schema": 1, "model": {"hidden_size": 64}, "versions": {"torch": "2.13"}}


def _fill(root: Path, inputs: dict = INPUTS, payload: bytes = b"x" * 4096) -> CompileCache:
    cache = CompileCache(root, environ={})
    cache.open(RunnerConfig(), inputs=inputs)
    assert cache.entry is not None and cache.filling
    (cache.entry / "inductor" / "graph.bin").write_bytes(payload)
    cache.commit(1.5)
    return cache


def test_miss_then_hit_and_markers(tmp_path: Path) -> None:
    first = _fill(tmp_path)
    assert first.info.state == "miss" and not first.filling
    entry = first.entry
    assert entry is not None
    ready = json.loads((entry / "READY").read_text())
    assert ready["warmup_seconds"] == 1.5 and ready["key"] == cache_key(INPUTS)
    assert ready["warmgate_version"]
    manifest = json.loads((entry / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"inductor/graph.bin"}
    assert json.loads((entry / "key.json").read_text())["inputs"] == INPUTS
    first.close()
    env: dict[str, str] = {}
    second = CompileCache(tmp_path, environ=env)
    assert second.open(RunnerConfig(), inputs=INPUTS).state == "hit"
    assert not second.filling and second.info.size_bytes >= 4096
    assert env == {var: str(entry / sub) for var, sub in CACHE_ENV_VARS.items()}
    second.close()


@pytest.mark.parametrize("damage", ["truncate", "delete", "ready_garbage", "no_ready",
                                    "key_garbage", "key_mismatch"])
def test_damaged_entry_is_moved_aside_and_rebuilt(tmp_path: Path, damage: str) -> None:
    cache = _fill(tmp_path)
    entry = cache.entry
    assert entry is not None
    cache.close()
    target = entry / "inductor" / "graph.bin"
    if damage == "truncate":
        target.write_bytes(b"x" * 100)
    elif damage == "delete":
        target.unlink()
    elif damage == "ready_garbage":
        (entry / "READY").write_text("{not json")
    elif damage == "no_ready":
        (entry / "READY").unlink()
    elif damage == "key_garbage":
        (entry / "key.json").write_text("")
    else:
        meta = json.loads((entry / "key.json").read_text())
        meta["key"] = "0" * 64
        (entry / "key.json").write_text(json.dumps(meta))
    again = CompileCache(tmp_path, environ={})
    info = again.open(RunnerConfig(), inputs=INPUTS)
    assert info.state == "rebuilt", info.detail
    assert again.filling and not (entry / "inductor" / "graph.bin").exists()
    assert len(list((tmp_path / ".trash").iterdir())) == 1
    again.commit(0.1)
    assert cache_fs.check_entry(entry, info.key) is None
    again.close()


def test_user_env_is_respected_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                         ) -> None:
    env = {"TRITON_CACHE_DIR": "/mine/triton"}
    cache = CompileCache(tmp_path, environ=env)
    with caplog.at_level("WARNING"):
        cache.open(RunnerConfig(), inputs=INPUTS)
    assert env["TRITON_CACHE_DIR"] == "/mine/triton"
    assert cache.info.respected_env == {"TRITON_CACHE_DIR": "/mine/triton"}
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))
    assert "TRITON_CACHE_DIR is already set (/mine/triton): respecting it" in caplog.text
    cache.close()


def test_miss_next_to_older_entry_logs_which_inputs_differ(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _fill(tmp_path).close()
    newer = {**INPUTS, "versions": {"torch": "2.14"}}
    cache = CompileCache(tmp_path, environ={})
    with caplog.at_level("WARNING"):
        assert cache.open(RunnerConfig(), inputs=newer).state == "miss"
    assert "versions.torch: '2.13' -> '2.14'" in caplog.text
    cache.close()
    assert cache_fs.diff_key_inputs({"a": {"b": 1}, "c": 2}, {"a": {"b": 3}}) == [
        "a.b: 1 -> 3", "c: 2 -> '<unset>'"]


def test_second_opener_waits_for_the_filler_then_hits(tmp_path: Path) -> None:
    filler = CompileCache(tmp_path, environ={})
    filler.open(RunnerConfig(), inputs=INPUTS)
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(
        CompileCache(tmp_path, environ={}).open(RunnerConfig(), inputs=INPUTS).state))
    waiter.start()
    time.sleep(0.3)
    assert not got  # blocked on the fill lock
    filler.commit(0.3)
    waiter.join(10)
    assert got == ["hit"]


def test_lock_timeout_runs_without_the_cache(tmp_path: Path) -> None:
    filler = CompileCache(tmp_path, environ={})
    filler.open(RunnerConfig(), inputs=INPUTS)
    env: dict[str, str] = {}
    late = CompileCache(tmp_path, lock_timeout_s=0.2, environ=env)
    assert late.open(RunnerConfig(), inputs=INPUTS).state == "lock_timeout"
    assert env == {}
    filler.close()


def test_unwritable_directory_is_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = CompileCache(blocker / "cache", environ={})
    assert cache.open(RunnerConfig(), inputs=INPUTS).state == "error"


def test_key_inputs_cover_what_changes_compiled_code() -> None:
    base = resolve_runner_config(RunnerConfig(), cuda_available=False)
    inputs = key_inputs(base, gpu={"name": "cpu", "capability": "cpu"},
                        versions={"torch": "2.13.0"})
    assert inputs["gpu"]["name"] == "cpu" and inputs["attention_backend"] == "torch"
    assert inputs["compilation"]["compile"] is False
    for field in ("max_num_seqs", "max_num_batched_tokens", "num_speculative_steps", "dtype"):
        assert field in inputs
    real = key_inputs(base)
    assert set(real["versions"]) == {"warmgate", "torch", "triton", "flashinfer-python"}
    assert real["versions"]["flashinfer-python"] == "absent"  # not installed on CPU
    import dataclasses

    spec = dataclasses.replace(base, speculative=dataclasses.replace(
        base.speculative, num_speculative_steps=2))
    assert cache_key(key_inputs(spec)) != cache_key(real)
    renamed = dataclasses.replace(base, model=dataclasses.replace(base.model, name="x", seed=3))
    assert cache_key(key_inputs(renamed)) == cache_key(real)  # values don't change code


def test_cli_ls_and_prune_skip_entries_in_use(tmp_path: Path) -> None:
    for torch_version in ("a", "b", "c"):
        _fill(tmp_path, {**INPUTS, "versions": {"torch": torch_version}}).close()
        time.sleep(0.02)
    in_use = CompileCache(tmp_path, environ={})  # the oldest, held by a "server"
    in_use.open(RunnerConfig(), inputs={**INPUTS, "versions": {"torch": "a"}})
    out = io.StringIO()
    assert cli.main(["cache", "ls", "--cache-dir", str(tmp_path), "--json"], out=out) == 0
    listed = json.loads(out.getvalue())
    assert [e["state"] for e in listed] == ["ready"] * 3
    assert listed[0]["name"] == in_use.info.key[:16]  # opening it counted as a use
    out = io.StringIO()
    assert cli.main(["--json", "cache", "prune", "--cache-dir", str(tmp_path), "--keep", "0"],
                    out=out) == 0
    pruned = json.loads(out.getvalue())
    assert pruned["in_use"] == [in_use.info.key[:16]] and len(pruned["removed"]) == 2
    in_use.close()
    out = io.StringIO()
    assert cli.main(["cache", "prune", "--cache-dir", str(tmp_path), "--keep", "1"],
                    out=out) == 0
    assert "removed 0, kept 1" in out.getvalue()
    assert cli.main(["cache", "ls", "--cache-dir", str(tmp_path / "nope")],
                    out=io.StringIO(), err=io.StringIO()) == EXIT_LOCAL


def test_cli_cache_and_server_imports_stay_light() -> None:
    """The CLI's cache commands need no torch; warmgate.server imports no compiler before
    the cache entry sets their variables."""
    code = ("import sys; from warmgate.client import cli; import warmgate.server.main, "
            "warmgate.server.app, warmgate.server.cache, warmgate.server.prewarm; "
            "print(sorted(m for m in ('torch', 'triton', 'flashinfer') if m in sys.modules))")
    env = {"PYTHONPATH": f"{ROOT / 'client'}:{ROOT / 'server'}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_run_concurrently_overlaps_and_times_each() -> None:
    def sleeper(s: float) -> object:
        return lambda: (time.sleep(s), s)[1]

    par = run_concurrently({"decode": sleeper(0.2), "prefill": sleeper(0.3)})
    assert par.results == {"decode": 0.2, "prefill": 0.3}
    assert par.wall_s < 0.45 and par.longest_s >= 0.3
    seq = run_concurrently({"decode": sleeper(0.1), "prefill": sleeper(0.1)}, parallel=False)
    assert seq.wall_s >= 0.2 and not seq.parallel

    def boom() -> None:
        raise RuntimeError("nvcc failed")

    with pytest.raises(RuntimeError, match="nvcc failed"):
        run_concurrently({"decode": boom, "prefill": sleeper(0.05)})


def test_metrics_count_the_entry_once_and_config_reads_the_flags() -> None:
    from warmgate.server.core.results import WarmupOutcome, WarmupReport
    from warmgate.server.startup import load_server_config
    from warmgate.server.telemetry.metrics import Metrics

    metrics = Metrics()
    for _ in range(2):  # a forced re-warmup repeats the entry; it was opened once
        metrics.observe_report(WarmupReport(WarmupOutcome.SUCCEEDED, [], 1.0, "h",
                                            compile_cache={"state": "hit"}))
    assert metrics.cache_hits.labels(cache="entry")._value.get() == 1
    assert metrics.cache_misses.labels(cache="entry")._value.get() == 0
    config = load_server_config(["--warmup-only", "--json"], {"WARMGATE_CACHE_DIR": "/c"},
                                resolve=False)
    assert (config.cache_dir, config.warmup_only, config.json_output) == ("/c", True, True)
    assert load_server_config([], {}, resolve=False).cache_dir is None
