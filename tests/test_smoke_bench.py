"""bench/warm.py smoke: every preset x backend x k, the memory each needs (a preset the card
cannot hold gets a row saying so), the order they run in, and the rows read from `bench/warm.py
served`'s output; then a real run on the CPU."""

from __future__ import annotations

import subprocess
import time
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
    """A running configuration in one of its states, as the coordinator sees it; go() makes
    it time its TTFT, and it records its stops."""
    preset, backend, k = config.split(":")
    run = SimpleNamespace(row=SmokeRow(SmokeConfig(preset, backend, int(k[1:]))),
                          started=started, warming=state == "warming",
                          waiting=state == "waiting", timing=state == "timing", went=False,
                          stopped=False, note="")

    def go() -> None:
        run.went, run.waiting, run.timing = True, False, True

    run.go = go
    run.pause = lambda: setattr(run, "stopped", True)
    run.resume = lambda: setattr(run, "stopped", False)
    return run


def _window(now: list[float]) -> object:
    quiet = load_script("bench/lib/smoke_quiet.py")
    return quiet.QuietWindow(clock=lambda: now[0], sleep=lambda s: None)


def test_ttft_is_timed_with_every_other_run_stopped_one_server_at_a_time() -> None:
    now = [0.0]
    window = _window(now)
    a, b = _run("tiny:triton:k0", "waiting", 2.0), _run("tiny:triton:k3", "waiting", 1.0)
    warming = _run("qwen3-0.6b:triton:k0", "warming")
    window.step([a, b, warming])
    assert b.went and not a.went  # the one waiting longest, while the other warms up
    assert a.stopped and warming.stopped and not b.stopped
    assert window.open
    window.step([a, b, warming])  # still timing: nothing changes
    assert not a.went and a.stopped and warming.stopped
    b.timing = False  # measured: the others go on, and the next one times
    window.step([a, b, warming])
    assert a.went and not a.stopped and b.stopped and warming.stopped
    window.step([b, warming])  # a's run ended while timing
    assert not window.open and not b.stopped and not warming.stopped


def test_a_stop_lasts_at_most_its_bound_and_the_row_says_so() -> None:
    now = [0.0]
    window = _window(now)
    slow, other = _run("tiny:torch:k0", "waiting"), _run("tiny:torch:k3", "warming")
    window.step([slow, other])
    now[0] = 7.9
    window.step([slow, other])
    assert other.stopped and not slow.note
    now[0] = 8.1
    window.step([slow, other])
    assert not other.stopped and not window.open
    assert "partly beside other servers" in slow.note


def test_new_runs_wait_only_for_a_backends_first_run_and_for_memory() -> None:
    smoke = load_script("bench/lib/smoke.py")
    queue = [SmokeConfig("llama-3.2-1b", "triton", 0)]
    waiting, warming = _run("tiny:triton:k3", "waiting"), _run("qwen3-0.6b:triton:k0", "warming")
    assert smoke._schedule(queue, [waiting, warming], set(), 10**12) == queue[0]
    assert smoke._schedule(queue, [warming], {"triton"}, 10**12) is None  # gated backend
    assert smoke._schedule(queue, [waiting], {"torch"}, 10**12) == queue[0]
    assert smoke._schedule(queue, [warming], set(), memory_bytes(queue[0]) - 1) is None


def test_a_stopped_process_group_is_stopped_and_its_stop_is_counted() -> None:
    quiet = load_script("bench/lib/smoke_quiet.py")
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        pause = quiet.ProcessGroupPause(proc.pid)
        pause.pause()
        assert _reaches(proc.pid, "T")
        time.sleep(0.2)
        pause.resume()
        assert _reaches(proc.pid, "S") and pause.paused_s >= 0.2
    finally:
        proc.kill()
        proc.wait()
    pause.pause()  # an ended group: nothing to stop, nothing counted
    assert pause.stopped_s() == pause.paused_s


def _reaches(pid: int, state: str) -> bool:
    """Whether the process's state letter in /proc (T: stopped, S: sleeping) becomes `state`
    within a second (a signal lands a moment after it is sent)."""
    for _ in range(100):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == state:
            return True
        time.sleep(0.01)
    return False


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
