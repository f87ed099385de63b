"""bench/warm.py smoke: every preset x backend x k, the memory each needs (a preset the card
cannot hold gets a row saying so), the order they run in, and the rows read from `bench/warm.py
served`'s output; then a real run on the CPU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.bench_harness import load_script, run_bench
from warmgate.server.config.presets import preset_names

plan = load_script("bench/lib/smoke_plan.py")
SmokeConfig, SmokeRow, read_served = plan.SmokeConfig, plan.SmokeRow, plan.read_served
fits, matrix, memory_bytes, run_order = plan.fits, plan.matrix, plan.memory_bytes, plan.run_order
GIB = 2**30
H100, H200 = 80 * GIB, 141 * GIB


def test_the_matrix_is_every_preset_backend_and_k() -> None:
    configs = matrix(None, ["torch", "triton", "flashinfer"], [0, 3])
    assert len(configs) == len(set(configs)) == len(preset_names()) * 3 * 2
    with pytest.raises(ValueError, match="unknown presets"):
        matrix(["llama-9"], ["torch"], [0])


def test_what_fits_an_h100_and_an_h200() -> None:
    mixtral, moe = SmokeConfig("mixtral-8x7b", "triton", 0), SmokeConfig("qwen3-30b-a3b",
                                                                        "triton", 0)
    assert not fits(mixtral, H100) and fits(mixtral, H200)  # 93 GB of weights in bf16
    assert fits(moe, H100)
    fp8 = SmokeConfig("qwen3-30b-a3b-fp8", "triton", 0)
    assert memory_bytes(fp8) < 0.6 * memory_bytes(moe)  # the experts at a byte


def test_a_backend_without_kernels_for_the_head_size_is_a_row_not_a_run() -> None:
    assert plan.why_not(SmokeConfig("tiny", "flashinfer", 0), H100) == (
        "does not apply: flashinfer supports head sizes 64, 128, 256; this model's is 16")
    assert plan.why_not(SmokeConfig("tiny", "triton", 0), H100) is None
    assert plan.why_not(SmokeConfig("mixtral-8x7b", "triton", 0), H100).startswith(
        "does not fit: needs about 93 GiB")


def _run(config: str, state: str, started: float = 0.0) -> SimpleNamespace:
    """A running configuration in one of its states, as the coordinator sees it."""
    preset, backend, k = config.split(":")
    run = SimpleNamespace(row=SmokeRow(SmokeConfig(preset, backend, int(k[1:]))),
                          started=started, warming=state == "warming",
                          waiting=state == "waiting", timing=state == "timing", went=False)
    run.go = lambda: setattr(run, "went", True)
    return run


def test_ttft_is_timed_in_quiet_and_nothing_starts_while_a_server_waits() -> None:
    smoke = load_script("bench/lib/smoke.py")
    queue = [SmokeConfig("llama-3.2-1b", "triton", 0)]
    a, b = _run("tiny:triton:k0", "waiting", 2.0), _run("tiny:triton:k3", "waiting", 1.0)
    warming = _run("qwen3-0.6b:triton:k0", "warming")
    smoke._quiet_ttft([a, b, warming])
    assert not a.went and not b.went  # another server still warms up
    assert smoke._schedule(queue, [a, b, warming], set(), 10**12) is None
    smoke._quiet_ttft([a, b])
    assert b.went and not a.went  # the one waiting longest, one at a time
    timing = _run("tiny:triton:k3", "timing")
    smoke._quiet_ttft([a, timing])
    assert not a.went
    serving = _run("tiny:torch:k0", "serving")  # past its TTFT: the next may start
    assert smoke._schedule(queue, [serving, warming], set(), 10**12) == queue[0]
    assert smoke._schedule(queue, [serving], {"triton"}, 10**12) == queue[0]
    assert smoke._schedule(queue, [warming], {"triton"}, 10**12) is None  # gated backend


def test_each_backend_runs_a_small_one_first_then_the_largest_first() -> None:
    configs = matrix(["llama-3.1-8b", "tiny", "qwen3-30b-a3b"], ["triton", "flashinfer"], [0])
    order = run_order(configs)
    assert [c.name for c in order[:2]] == ["tiny:triton:k0", "tiny:flashinfer:k0"]
    assert [c.preset for c in order[2:4]] == ["qwen3-30b-a3b"] * 2


SERVED = """server: --model qwen3-30b-a3b --device cuda --metrics-port 0
ready in 41.3 s
ttft: first 14.83 ms, steady median 14.05 ms over 5, first/steady 1.06
workload: 50 requests in 3 waves of 1..64, prompts 1..512, 900 tokens in 2.1 s, \
errors {'INTERNAL': 2, 'UNAVAILABLE': 1}
options: greedy 10
after_ready: compiles 3 (autotune 1, triton 2) graph_misses 4
"""


def test_a_row_reads_the_served_output_and_names_its_faults() -> None:
    row = read_served(SmokeRow(SmokeConfig("qwen3-30b-a3b", "triton", 0), exit_code=1), SERVED)
    assert (row.ready_s, row.ttft_ratio, row.errors) == (41.3, 1.06, 3)
    assert (row.compiles, row.autotunes, row.graph_misses) == (2, 1, 4)
    assert row.faults() == ["exit 1", "compiles 2", "autotunes 1", "graph misses 4",
                            "errors 3"]
    clean = read_served(SmokeRow(SmokeConfig("tiny", "torch", 3), exit_code=0),
                        SERVED.replace("errors {'INTERNAL': 2, 'UNAVAILABLE': 1}", "errors 0")
                        .replace("compiles 3 (autotune 1, triton 2) graph_misses 4",
                                 "compiles 0 (none) graph_misses 0"))
    assert clean.clean and plan.format_row(clean).endswith("clean")
    slow = SmokeRow(clean.config, 0, 1.0, 1.2, 0, 0, 0, 0)
    assert slow.faults() == ["first/steady TTFT 1.20 > 1.15"]
    strict = SmokeRow(clean.config, 0, 1.0, 1.08, 0, 0, 0, 0, ttft_limit=1.05)
    assert strict.faults() == ["first/steady TTFT 1.08 > 1.05"]
    assert not SmokeRow(clean.config, 0, 1.0, 1.08, 0, 0, 0, 0).faults()


@pytest.mark.slow
def test_a_smoke_run_on_the_cpu(tmp_path: Path) -> None:
    """tiny on the torch backend at k=3 runs; mixtral, which no CPU host of the suite holds,
    is a row that says so."""
    result = run_bench("bench/warm.py smoke", [
        "--device", "cpu", "--presets", "tiny,mixtral-8x7b", "--backends", "torch", "--ks", "3",
        "--requests", "5", "--logs", str(tmp_path)])
    table = result.stdout.split("\nsmoke, cpu")[-1]
    row = next(ln for ln in table.splitlines() if ln.startswith("tiny:torch:k3")).split()
    # compiles, autotunes, misses, errors, exit (TTFT on a busy 2-core machine is noise)
    assert row[3:8] == ["0"] * 5, result.stdout + result.stderr
    assert float(row[1]) > 0 and float(row[2]) > 0  # ready s, first/steady TTFT
    mixtral = next(ln for ln in table.splitlines() if ln.startswith("mixtral-8x7b:torch:k3"))
    assert "does not fit: needs about 93 GiB" in mixtral
    assert (tmp_path / "tiny-torch-k3.txt").is_file()
