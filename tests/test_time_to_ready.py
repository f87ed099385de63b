"""bench/start.py time-to-ready end to end on the CPU (tiny, one run), run as a user runs it
(tests/bench_harness.py), and its log parsing (devtools.ready_log)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from tests.bench_harness import load_script, run_bench
from warmgate.server.devtools.checkpoint import write_checkpoint
from warmgate.server.devtools.ready_log import ReadyRun


def time_to_ready(*args: str) -> str:
    proc = run_bench("bench/start.py time-to-ready", args, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset's checkpoint, written here once for the tests that only read it: the
    bench's --write-checkpoint (test_end_to_end_on_the_cpu) is a process of its own, two
    seconds of imports each time."""
    directory = tmp_path_factory.mktemp("ttr") / "tiny"
    write_checkpoint("tiny", directory, "cpu", "bfloat16")
    return directory


def _figures(out: str) -> dict:
    line = next(x for x in out.splitlines() if x.startswith("json: "))
    return json.loads(line.removeprefix("json: "))


@pytest.mark.slow
def test_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    model_dir = tmp_path / "tiny"
    kept, logs = tmp_path / "kept-cache", tmp_path / "logs"
    out = time_to_ready("--write-checkpoint", "tiny", "--model-dir", str(model_dir),
                        "--device", "cpu", "--attention-backend", "torch", "--runs", "2",
                        "--timeout", "240", "--keep-cache-dir", str(kept),
                        "--log-dir", str(logs))
    f = _figures(out)
    # The servers' cache is the one asked for, left filled; each server's log is kept.
    assert any(kept.iterdir())
    assert sorted(p.name for p in logs.iterdir()) == ["cold.log", "warm-1.log", "warm-2.log"]
    assert "config_hash=" in (logs / "warm-1.log").read_text()
    assert (model_dir / "config.json").exists() and f["checkpoint"].startswith("wrote tiny")
    # The processes' imports were byte-compiled first (in place where every directory is
    # writable), the repository's server among them, and it said so and how long it took.
    where = f["bytecode"]["where"]
    assert re.search(rf"^bytecode: compiled \d+ directories {re.escape(where)} in [\d.]+ s",
                     out, re.M)
    assert f["bytecode"]["seconds"] > 0
    server = Path(__file__).resolve().parents[1] / "server"
    assert str(server) in f["bytecode"]["dirs"]
    if where == "in place":
        assert list((server / "warmgate" / "server" / "__pycache__").glob("main.*.pyc"))
    # The floor's CUDA init and bare load ran once per --runs, each printed, the median kept.
    assert len(re.findall(r"^floor run \d/2: CUDA init [\d.]+ s$", out, re.M)) == 2
    assert f["cuda_init_s"] == pytest.approx(statistics.median(f["cuda_init_runs_s"]))
    assert f["bare_load_s"] == pytest.approx(statistics.median(f["bare_load_runs_s"]))
    for key in ("cuda_init_s", "bare_load_s", "floor_s", "cold_ready_s", "warm_ready_s",
                "ready_over_floor", "warm_over_cold", "cold_warmup_s"):
        assert f[key] > 0, key
        assert f"{key}: " in out
    assert f["floor_s"] == pytest.approx(f["cuda_init_s"] + f["bare_load_s"])
    assert f["ready_over_floor"] == pytest.approx(f["warm_ready_s"] / f["floor_s"])
    # Each warm start comes right after its own floor runs (not all floor runs first), and
    # has its own ratio.
    assert f["ready_over_floor_runs"] == [pytest.approx(w / (i + b)) for w, i, b in zip(
        f["warm_ready_runs_s"], f["cuda_init_runs_s"], f["bare_load_runs_s"], strict=True)]
    lines = out.splitlines()
    order = [next(i for i, x in enumerate(lines) if x.startswith(p))
             for p in ("floor run 1/2: CUDA init", "floor run 1/2: bare load",
                       "warm run 1/2: ready in", "floor run 2/2: CUDA init",
                       "warm run 2/2: ready in")]
    assert order == sorted(order)
    assert f["warm_over_cold"] == pytest.approx(f["warm_ready_s"] / f["cold_ready_s"])
    # The CPU torch backend compiles nothing: no ratio rather than a made-up one.
    assert f["cold_longest_compile_s"] is None and f["cold_over_longest_compile"] is None
    warm = f["warm_breakdown"]
    assert warm["ready_s"] in f["warm_ready_runs_s"]  # the run nearest the median
    # The health process binds from the flags alone, before the configuration is checked
    # and logged (api/health_process.py).
    assert 0 < warm["health_bound_at_s"] < warm["imports_and_config_s"] < warm["ready_s"]
    assert warm["weights_s"] > 0 and warm["weights_gb_per_s"] > 0 and warm["kv_cache_s"] >= 0
    for phase in ("load", "compile", "kernels.prefill", "kernels.decode", "mixed"):
        assert f"phase.{phase}_s" in warm
    assert warm["warmup_total_s"] > 0


def test_the_bytecode_step_compiles_every_source_the_walk_reaches(tmp_path: Path) -> None:
    """What compileall's walk compiles (sources in subdirectories; not a __pycache__ or a
    linked directory), each result read: a file that does not compile fails the step and the
    later ones still compile."""
    bench = load_script("bench/lib/time_to_ready.py")
    tree = tmp_path / "tree"
    for name in ("a.py", "pkg/b.py", "pkg/deeper/c.py", "pkg/__pycache__/stray.py",
                 "zz_last.py"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("X = 1\n")
    (tree / "pkg" / "broken.py").write_text("def (:\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "linked.py").write_text("Y = 2\n")
    (tree / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    _, result = bench._python(bench.BYTECODE_COMPILE, str(tmp_path / "no-stdlib"), str(tree))
    compiled = sorted(str(p.relative_to(tree)) for p in tree.rglob("*.pyc"))
    assert [re.sub(r"\.cpython-\d+", "", c) for c in compiled] == [
        "__pycache__/a.pyc", "__pycache__/zz_last.pyc", "pkg/__pycache__/b.pyc",
        "pkg/deeper/__pycache__/c.pyc"]
    assert result["all_compiled"] is False  # broken.py
    assert not list((tmp_path / "elsewhere").rglob("*.pyc"))


def test_a_kept_cache_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    (tmp_path / "old-entry").mkdir()
    proc = run_bench("bench/start.py time-to-ready",
                     ["--model-dir", str(tmp_path), "--device", "cpu",
                      "--keep-cache-dir", str(tmp_path)], timeout=60)
    assert proc.returncode == 2 and "not empty" in proc.stderr


@pytest.mark.slow
def test_load_only_compares_bare_and_warmgate(tiny_dir: Path) -> None:
    model_dir = tiny_dir
    out = time_to_ready("--model-dir", str(model_dir), "--device", "cpu", "--runs", "1",
                        "--load-only", "--cold-page-cache", "--no-compile-bytecode")
    assert "bytecode: not compiled (--no-compile-bytecode)" in out
    f = _figures(out)
    for which in ("load_page_cache_warm", "load_page_cache_cold"):
        load = f[which]
        assert load["bytes"] == sum(p.stat().st_size for p in model_dir.glob("*.safetensors")
                                    ) - _header_bytes(model_dir)
        assert load["bare_gb_per_s"] == pytest.approx(load["bytes"] / 1e9 / load["bare_s"])
        assert load["warmgate_over_bare_speed"] == pytest.approx(
            load["bare_s"] / load["warmgate_s"])


def _header_bytes(model_dir: Path) -> int:
    total = 0
    for p in model_dir.glob("*.safetensors"):
        total += 8 + int.from_bytes(p.read_bytes()[:8], "little")
    return total


def test_breakdown_and_longest_compile_from_the_log() -> None:
    log = [
        (2.5, "2026 INFO warmgate.server.main: config_hash=abc runner={}"),
        (2.6, "2026 INFO warmgate.server.control.background_startup: start-up: CUDA context "
              "on cuda:0 in 1.250 s (in the background, beside imports and config)"),
        (2.7, "2026 INFO warmgate.server.app: serving grpc.health.v1 (plaintext) on "
              "127.0.0.1:4321"),
        (3.1, "2026 INFO warmgate.server.runner.weights: weights read: 1 files, 2.470 GB in "
              "0.300 s (8.23 GB/s), 160 reads by 8 threads, staged"),
        (3.2, '2026 INFO warmgate.server.report: phase=load status=ran seconds=0.500 reason=- '
              'shapes={"kv_cache_s":0.02,"weights_s":0.31} num_reqs=0 num_tokens=0 steps=0 '
              'detail=x'),
        (3.3, "2026 DEBUG warmgate.server.jit.monitor: jit event: triton _rms_norm compiled "
              "in 0.700 s, caused by no batch in flight (after_ready=False)"),
        (3.4, "2026 DEBUG warmgate.server.jit.monitor: jit event: triton _rotary loaded from "
              "cache in 0.900 s, caused by no batch in flight (after_ready=False)"),
        (4.0, '2026 INFO warmgate.server.report: phase=flashinfer status=ran seconds=2.000 '
              'reason=- shapes={"longest_module_s":1.5,"wall_s":1.9} num_reqs=0 '
              'num_tokens=0 steps=1 detail=y'),
        (4.5, "2026 INFO warmgate.server.report: warmup outcome=succeeded seconds=3.000 "
              "phases=8 config_hash=abc"),
    ]
    run = ReadyRun(ready_s=4.6, lines=log)
    b = run.breakdown()
    assert b["imports_and_config_s"] == 2.5 and b["health_bound_at_s"] == 2.7
    assert b["cuda_init_s"] == 1.25 and b["weights_s"] == 0.3
    assert b["weights_gb_per_s"] == 8.23 and b["kv_cache_s"] == 0.02
    assert b["phase.load_s"] == 0.5 and b["phase.flashinfer_s"] == 2.0
    assert b["warmup_total_s"] == 3.0
    # A cache load is no compile; without JIT events, FlashInfer's longer wrapper warmup.
    assert run.longest_compile_s() == 0.7
    assert ReadyRun(ready_s=1.0, lines=log[:5] + log[6:]).longest_compile_s() == 1.5
    assert ReadyRun(ready_s=1.0, lines=log[:5]).longest_compile_s() is None


@pytest.mark.slow
def test_a_server_that_exits_is_reported_with_its_log(tiny_dir: Path) -> None:
    # The last --model wins: the server refuses it at start-up and exits 2. Nothing to
    # byte-compile for that (test_end_to_end_on_the_cpu checks the step): it took 9 s here.
    proc = run_bench("bench/start.py time-to-ready", [
        "--model-dir", str(tiny_dir), "--device", "cpu", "--attention-backend", "torch",
        "--runs", "1", "--timeout", "120", "--no-compile-bytecode",
        "--server-flag=--model=no-such-model"], timeout=300)
    assert proc.returncode != 0
    assert re.search(r"(?s)RuntimeError: server not SERVING \(exit code 2\).*no-such-model",
                     proc.stderr), proc.stderr[-3000:]
