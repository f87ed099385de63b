"""bench/warm.py smoke: every preset x backend x k, the memory each needs (a preset the card
cannot hold gets a row saying so), the order they run in, and the rows read from `bench/warm.py
served`'s output; then a real run on the CPU."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.bench_harness import load_script, run_bench
from warmgate.server.config.presets import preset_names
from warmgate.server.runner.attention import flashinfer_backend as fi_backend

plan = load_script("bench/lib/smoke_plan.py")
jit = load_script("bench/lib/smoke_jit.py")
schedule = load_script("bench/lib/smoke_schedule.py")
memory = load_script("bench/lib/smoke_memory.py")
smoke = load_script("bench/lib/smoke.py")
SmokeConfig, SmokeRow, read_served = plan.SmokeConfig, plan.SmokeRow, plan.read_served
fits, matrix, memory_bytes, run_order = plan.fits, plan.matrix, plan.memory_bytes, plan.run_order
GIB = 2**30
H100, H200 = 80 * GIB, 141 * GIB
H100_CARD = 79 * GIB  # what torch reports of an H100 80GB


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


def test_the_overhead_and_the_share_set_each_estimate_and_what_the_card_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    moe = SmokeConfig("qwen3-30b-a3b", "triton", 0)
    assert memory_bytes(moe) - memory_bytes(SmokeConfig("qwen3-30b-a3b", "triton", 0, GIB)) \
        == plan.OVERHEAD_BYTES - GIB
    assert {c.overhead_bytes for c in matrix(["tiny"], ["torch"], [0, 3], GIB)} == {GIB}
    assert fits(moe, H100) and not fits(moe, H100, share=0.7)
    # The flags reach the plan: mixtral (91 GiB of weights and KV) fits 100 GiB only with
    # 2 GiB of overhead and 95 % of the card.
    seconds = tmp_path / "seconds.txt"
    seconds.write_text("\n".join(["# configuration estimate_GiB ran_s stopped_s ready_s",
                                   "tiny:torch:k0 4.0 30 0 10",
                                   "mixtral-8x7b:torch:k0 93 60 0 30"]) + "\n")
    flags = ["--plan", str(seconds), "--backends", "torch", "--ks", "0",
             "--presets", "tiny,mixtral-8x7b", "--plan-gib", "100"]
    assert smoke.main(flags) == 0
    default = capsys.readouterr().out
    assert smoke.main([*flags, "--overhead-gib", "2", "--memory-share", "0.95"]) == 0
    lean = capsys.readouterr().out
    assert "1 of 2 configurations run" in default and "tiny:torch:k0 4.0 GiB" in " ".join(
        default.split())
    assert "2 of 2 configurations run" in lean and "tiny:torch:k0 2.0 GiB" in " ".join(
        lean.split())


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
    build = SimpleNamespace(stopped=False)  # a JIT prebuild: nvcc on every core
    build.pause = lambda: setattr(build, "stopped", True)
    build.resume = lambda: setattr(build, "stopped", False)
    window.step([a, b, warming], [build])
    assert b.went and not a.went  # the one waiting longest, while the other warms up
    assert a.stopped and warming.stopped and build.stopped and not b.stopped
    assert window.open
    window.step([a, b, warming], [build])  # still timing: nothing changes
    assert not a.went and a.stopped and warming.stopped and build.stopped
    b.timing = False  # measured: the others go on, and the next one times
    window.step([a, b, warming], [build])
    assert a.went and not a.stopped and b.stopped and warming.stopped and build.stopped
    window.step([b, warming], [build])  # a's run ended while timing
    assert not window.open and not b.stopped and not warming.stopped and not build.stopped


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


def test_new_runs_wait_only_for_their_gate_and_for_memory() -> None:
    """torch and triton wait while their backend's first run warms alone; FlashInfer waits for
    its JIT key's prebuild instead; and all of them for memory."""
    queue = [SmokeConfig("llama-3.2-1b", "triton", 0)]
    fi = SmokeConfig("qwen3-0.6b", "flashinfer", 0)
    key = jit.JitKey(128, "bfloat16", False)
    gates = schedule.Gates({queue[0]: None, fi: key})
    first = SmokeConfig("tiny", "triton", 0)
    assert not gates.may_start(queue[0], [first])  # triton's first run is warming
    assert gates.may_start(queue[0], [SmokeConfig("tiny", "torch", 0)])
    gates.compiled("triton")  # ready: the cold compile is in the caches
    assert gates.may_start(queue[0], [first])
    assert not gates.may_start(fi, [])
    gates.built.add(key)
    assert gates.may_start(fi, [first])
    pick = schedule.Scheduler(memory_bytes(queue[0]) + memory_bytes(first), 4).pick
    assert pick(queue, [first], lambda c: True) == queue[0]
    assert pick(queue, [first], lambda c: True, held=1) is None  # a prebuild holds the rest
    assert pick(queue, [first], lambda c: False) is None
    assert schedule.Scheduler(10**13, 1).pick(queue, [first], lambda c: True) is None


def test_a_waiting_head_keeps_its_place_and_smaller_ones_fill_in_only_beside_it() -> None:
    big, fp8 = SmokeConfig("qwen3-30b-a3b", "triton", 0), SmokeConfig("qwen3-30b-a3b-fp8",
                                                                       "triton", 0)
    small, tiny = SmokeConfig("qwen3-0.6b", "torch", 0), SmokeConfig("tiny", "torch", 3)
    budget = int(0.9 * H100)
    scheduler = schedule.Scheduler(budget, 4)
    queue = [big, small, tiny]
    # fp8 runs: the head (big) does not fit; small fits beside both fp8 and big, so it starts.
    assert scheduler.pick(queue, [fp8], lambda c: True) == small
    assert scheduler.head == big
    # tiny would fit beside fp8 and small, but not beside big and small: it waits.
    assert memory_bytes(fp8) + memory_bytes(small) + memory_bytes(tiny) <= budget
    assert memory_bytes(big) + memory_bytes(small) + memory_bytes(tiny) > budget
    assert scheduler.pick([big, tiny], [fp8, small], lambda c: True) is None
    # fp8, which the head waited for, ends: the head starts beside small at once.
    assert scheduler.pick([big, tiny], [small], lambda c: True) == big
    assert scheduler.head is None
    # Two servers at once at most, while prebuilds hold what keeps the head waiting: one
    # smaller run may start beside it, and the other slot stays the head's.
    two, held = schedule.Scheduler(H100, 2), H100 - memory_bytes(big) + 1
    assert two.pick([big, small, tiny], [], lambda c: True, held=held) == small
    assert two.pick([big, tiny], [small], lambda c: True, held=held) is None
    assert two.head == big


SECONDS = {"tiny": 30, "qwen3-0.6b": 40, "qwen2.5-1.5b": 40, "llama-3.2-1b": 40,
           "mistral-7b": 45, "llama-3.1-8b": 45, "llama-3.1-8b-fp8": 60,
           "qwen3-30b-a3b-fp8": 70, "qwen3-30b-a3b": 50}  # about an H100's, by preset


def _h100_plan(scheduler: type) -> tuple[list, list]:
    """The H100 matrix replayed on fixed seconds (ready at half of each run)."""
    configs = [c for c in matrix(None, ["torch", "triton", "flashinfer"], [0, 3])
               if plan.why_not(c, H100_CARD) is None]
    keys = {c: jit.jit_key(c, "cuda", (9, 0)) for c in configs}
    queue = run_order(configs, {"torch", "triton"})
    seconds = {c: (SECONDS[c.preset], SECONDS[c.preset] / 2) for c in configs}
    original, schedule.Scheduler = schedule.Scheduler, scheduler
    try:
        return schedule.simulate(queue, keys, seconds, {k: 110.0 for k in keys.values() if k},
                                 int(0.9 * H100_CARD), 4, 480.0)
    finally:
        schedule.Scheduler = original


def test_the_largest_preset_starts_before_the_deadline_in_a_simulated_h100_run() -> None:
    done, left = _h100_plan(schedule.Scheduler)
    moe = [p for p in done if p.config.preset == "qwen3-30b-a3b"]
    assert len(moe) == 6 and all(p.start_s < 480 for p in moe), [c.name for c in left]
    by_name = {p.config.name: p for p in done}
    # Each FlashInfer run starts once its key's prebuild (110 s here) has ended.
    assert min(p.start_s for p in done if p.config.backend == "flashinfer") >= 110.0
    # tiny warms alone per backend; the others of its backend start once it is ready.
    assert min(p.start_s for p in done if p.config.backend == "torch"
               and p.config.preset != "tiny") >= by_name["tiny:torch:k0"].ready_s
    # No two runs ever held more than the budget at once.
    for p in done:
        at = [q for q in done if q.start_s <= p.start_s < q.end_s]
        assert sum(memory_bytes(q.config) for q in at) <= 0.9 * H100_CARD


class _FirstThatFits(schedule.Scheduler):
    """The rule before: the first configuration that fits starts, whatever waits before it."""

    def pick(self, queue, running, may_start, held=0):  # type: ignore[no-untyped-def]
        if len(running) >= self.parallel:
            return None
        free = self.budget - held - sum(memory_bytes(c) for c in running)
        return next((c for c in queue if may_start(c) and memory_bytes(c) <= free), None)


def test_the_simulated_h100_run_starves_the_largest_preset_if_smaller_ones_pass_it() -> None:
    """The timeline above tells the rules apart: passing the head starves it there."""
    _, left = _h100_plan(_FirstThatFits)
    assert any(c.preset == "qwen3-30b-a3b" for c in left)


def test_the_jit_keys_of_the_h100_matrix_and_their_minimal_specs() -> None:
    keys = {jit.jit_key(c, "cuda", (9, 0)) for c in matrix(None, ["flashinfer"], [0, 3])
            if plan.why_not(c, H100_CARD) is None}
    assert keys == {jit.JitKey(64, "bfloat16", True), jit.JitKey(128, "bfloat16", True),
                    jit.JitKey(128, "bfloat16", False)}  # qwen3-0.6b: 16 heads on 8
    assert jit.jit_key(SmokeConfig("llama-3.1-8b-fp8", "flashinfer", 0), "cuda", (9, 0)) == \
        jit.JitKey(128, "bfloat16", True)  # FP8 projections, bf16 attention
    assert jit.jit_key(SmokeConfig("llama-3.1-8b", "triton", 0)) is None
    for key in keys:
        spec = jit.minimal_spec(key, "cpu")
        assert (spec.head_dim, str(spec.dtype), fi_backend.tensor_core_decode(
            spec.num_heads, spec.num_kv_heads)) == (key.head_dim, f"torch.{key.dtype}",
                                                    key.tensor_cores)


def test_a_prebuild_stops_as_a_group_and_its_timeout_leaves_out_its_stops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = jit.JitKey(128, "bfloat16", True)
    monkeypatch.setattr(jit.JitKey, "argv", lambda self, device: ["sleep", "30"])
    build = jit.Prebuild(key, "cpu", tmp_path / "jit.txt")
    try:
        build.pause()
        assert _reaches(build.proc.pid, "T")
        time.sleep(0.3)
        assert not build.poll(0.2)  # 0.3 s old, all of it stopped: not past 0.2 s
        build.resume()
        assert _reaches(build.proc.pid, "S")
        time.sleep(0.25)
        assert build.poll(0.2) and "timed out after 0 s" in build.note
    finally:
        build.kill()


def test_a_failed_prebuild_ends_with_its_output_in_the_note(tmp_path: Path) -> None:
    build = jit.Prebuild(jit.JitKey(128, "bfloat16", True), "cpu", tmp_path / "jit.txt")
    while not build.poll(60.0):
        time.sleep(0.1)
    assert build.exit_code == 2 and not build.ok
    assert build.note.startswith("FlashInfer JIT prebuild (head 128 bfloat16 tensor-core "
                                 "decode) failed, exit 2; jit.txt:")
    assert "--device cpu: FlashInfer builds its modules for a CUDA device" in build.note


# nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits on an H100
# with two servers (one with an engine process) and a process whose figure the driver hides.
COMPUTE_APPS = """1201, 20184
1207, 518
1388, 65210
1390, [N/A]
"""


def test_device_memory_is_summed_over_each_runs_session() -> None:
    assert memory.parse_compute_apps(COMPUTE_APPS) == {
        1201: 20184 * 2**20, 1207: 518 * 2**20, 1388: 65210 * 2**20}
    assert memory.parse_compute_apps("") == {}
    now = [0.0]
    texts = [COMPUTE_APPS, COMPUTE_APPS.replace("20184", "10000")]
    sessions = {1201: 1200, 1207: 1200, 1388: 1380}
    sampler = memory.MemorySampler(True, query=lambda: texts.pop(0),
                                   session=sessions.get, clock=lambda: now[0])
    sampler.sample([1200, 1380])
    sampler.sample([1200])  # within the second: no sample
    now[0] = 1.5
    sampler.sample([1200])
    assert sampler.peak(1200) == (20184 + 518) * 2**20  # the peak, not the last sample
    assert sampler.peak(1380) == 65210 * 2**20
    assert sampler.peak(999) is None
    off = memory.MemorySampler(False, query=lambda: COMPUTE_APPS, session=sessions.get)
    off.sample([1200])
    assert off.peak(1200) is None


def test_the_rows_show_peak_beside_estimate_and_one_line_sums_them_up() -> None:
    small, big = SmokeConfig("tiny", "torch", 0), SmokeConfig("llama-3.1-8b", "triton", 3)
    rows = [SmokeRow(small, exit_code=0, peak_bytes=3 * GIB),
            SmokeRow(big, exit_code=0, peak_bytes=plan.weights_and_kv_bytes(big) + 5 * GIB),
            SmokeRow(SmokeConfig("tiny", "triton", 0), exit_code=0)]
    assert plan.format_row(rows[0]).split()[8:10] == ["4.0", "3.0"]
    assert plan.format_row(rows[2]).split()[8:10] == ["4.0", "-"]
    line = memory.summary(rows)
    ratio = (plan.weights_and_kv_bytes(big) + 5 * GIB) / memory_bytes(big)
    assert line == (f"device memory, 2 runs measured: peak/estimate at most {ratio:.2f} "
                    "(llama-3.1-8b:triton:k3); beyond weights and KV cache at most 5.0 GiB "
                    "(llama-3.1-8b:triton:k3), --overhead-gib is 4.0")
    assert memory.summary(rows[2:]).startswith("device memory: not measured")


def test_a_stopped_session_is_stopped_and_its_stop_is_counted() -> None:
    quiet = load_script("bench/lib/smoke_quiet.py")
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        pause = quiet.SessionPause(proc.pid)
        pause.pause()
        assert _reaches(proc.pid, "T")
        time.sleep(0.2)
        pause.resume()
        assert _reaches(proc.pid, "S") and pause.paused_s >= 0.2
    finally:
        proc.kill()
        proc.wait()
    pause.pause()  # an ended session: nothing to stop, nothing counted
    assert pause.stopped_s() == pause.paused_s


# A prebuild's shape: its leader starts a job in a process group of its own, as ninja starts
# every compile (nvcc), and waits for it.
_NINJA_LIKE = """
import subprocess, sys
job = subprocess.Popen(["sleep", "30"], process_group=0)
print(job.pid, flush=True)
job.wait()
"""


def test_a_session_stop_reaches_a_job_in_a_process_group_of_its_own() -> None:
    quiet = load_script("bench/lib/smoke_quiet.py")
    leader = subprocess.Popen([sys.executable, "-c", _NINJA_LIKE], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    assert leader.stdout is not None
    job = int(leader.stdout.readline())
    try:
        assert os.getpgid(job) != leader.pid  # out of the leader's group: killpg misses it
        pause = quiet.SessionPause(leader.pid)
        pause.pause()
        assert _reaches(job, "T") and _reaches(leader.pid, "T")
        pause.resume()
        assert _reaches(job, "S") and _reaches(leader.pid, "S")
        assert quiet.signal_session(leader.pid, signal.SIGKILL) == 2
        assert leader.wait(10) == -signal.SIGKILL
        assert _gone(job)
    finally:
        quiet.signal_session(leader.pid, signal.SIGKILL)
        leader.wait()


def _gone(pid: int) -> bool:
    """Whether the process has ended (reaped, or a zombie) within a second."""
    for _ in range(100):
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.01)
    return False


def _reaches(pid: int, state: str) -> bool:
    """Whether the process's state letter in /proc (T: stopped, S: sleeping) becomes `state`
    within a second (a signal lands a moment after it is sent)."""
    for _ in range(100):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == state:
            return True
        time.sleep(0.01)
    return False


def test_each_backend_without_a_prebuild_runs_a_small_one_first_then_the_largest_first(
        ) -> None:
    configs = matrix(["llama-3.1-8b", "tiny", "qwen3-30b-a3b"], ["triton", "flashinfer"], [0])
    order = run_order(configs, {"triton"})
    assert order[0].name == "tiny:triton:k0"
    assert [c.name for c in order[1:3]] == ["qwen3-30b-a3b:flashinfer:k0",
                                            "qwen3-30b-a3b:triton:k0"]
    assert order[-1].name == "tiny:flashinfer:k0"  # FlashInfer's JIT is its prebuild's


def test_plan_reads_run_and_ready_seconds() -> None:
    text = ("# H100\n# configuration estimate_GiB ran_s stopped_s ready_s\n"
            "tiny:torch:k0 4.0 33 2 19.0\n\n")
    assert schedule.read_seconds(text) == {"tiny:torch:k0": (33.0, 19.0)}
    with pytest.raises(ValueError, match="no '# configuration"):
        schedule.read_seconds("tiny:torch:k0 33\n")
    with pytest.raises(ValueError, match="no ran_s and ready_s figures"):
        schedule.read_seconds(text + "tiny:torch:k3 4.0 33\n")


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
    # The SM clock before each TTFT request's gap (the first, then the steady ones, whose
    # median the row keeps): a slow first one sent at lower clocks says so in its fault.
    clocked_output = (SERVED.replace("first/steady 1.06", "first/steady 1.40")
                      + "ttft sm clock MHz: 345 1500 1980 1755 1980 1980\n")
    clocked = read_served(SmokeRow(clean.config, exit_code=0), clocked_output)
    assert clocked.ttft_clocks == (345, 1980)
    assert "first/steady TTFT 1.40 > 1.15 (first at 345 MHz, steady 1980)" in clocked.faults()
    # Every request's TTFT: the first, then the steady ones; the slowest steady one over
    # their median says whether the first stood out or shared the steady ones' jitter.
    sampled = read_served(SmokeRow(clean.config, exit_code=0), clocked_output + (
        "ttft samples ms: client 12.91 6.89 9.46 5.71 9.63 13.89; "
        "server 9.14 5.33 7.79 3.89 3.72 8.08\n"))
    assert sampled.ttft_slowest_steady == pytest.approx(13.89 / 9.46)
    assert ("first/steady TTFT 1.40 > 1.15 (first at 345 MHz, steady 1980; slowest steady "
            "1.47)") in sampled.faults()
    # Past the limit: clocked (its steady samples unread), sampled (a steady one at 1.47, the
    # first at 1.40) and one whose first at 1.60 stood out; only sampled shared the jitter.
    standout = dataclasses.replace(sampled, ttft_ratio=1.60)
    assert plan.ttft_summary([clean, clocked, sampled, standout]) == (
        "first/steady TTFT past the limit in 3 rows; in 1 of them a steady request took at "
        "least as long as the first")
    assert plan.ttft_summary([clean]) is None


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
    assert "config_hash=" in (tmp_path / "tiny-torch-k3.server.txt").read_text()  # its own log
    assert row[8:10] == ["4.0", "-"]  # est GiB; peak GiB: no nvidia-smi on the CPU
    assert "device memory: not measured" in table


@pytest.mark.slow
def test_a_failed_prebuild_fails_its_keys_rows_and_the_smoke(tmp_path: Path) -> None:
    """FlashInfer on the CPU: its key's prebuild fails at once, and its rows say why."""
    result = run_bench("bench/warm.py smoke", [
        "--device", "cpu", "--presets", "qwen3-0.6b", "--backends", "flashinfer", "--ks", "0,3",
        "--logs", str(tmp_path)], timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FlashInfer JIT prebuild head 128 float32 plain decode: FAILED in" in result.stdout
    table = result.stdout.split("\nsmoke, cpu")[-1]
    for k in (0, 3):
        row = next(ln for ln in table.splitlines() if ln.startswith(f"qwen3-0.6b:flashinfer:k{k}"))
        assert "not run: FlashInfer JIT prebuild (head 128 float32 plain decode) failed" in row
        assert "FlashInfer builds its modules for a CUDA device" in row
    assert "2 configurations: 0 clean, 0 not clean, 0 do not fit or apply, 2 not run" in table


def test_served_writes_the_servers_log_when_the_server_fails(tmp_path: Path) -> None:
    log = tmp_path / "server.txt"
    result = run_bench("bench/warm.py served", [
        "--server-args", "--model tiny --device cuda", "--server-log", str(log)], timeout=120)
    assert result.returncode != 0
    assert "CUDA is not available" in log.read_text(), result.stdout + result.stderr


def test_the_sm_clock_is_read_through_nvidia_smi_without_nvml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pynvml the query tool answers; its failure, or no tool at all, reads None."""
    clock = load_script("bench/lib/gpu_clock.py")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    tool = tmp_path / "nvidia-smi"
    tool.write_text('#!/bin/sh\n[ "$2" = 3 ] && echo 1755 || exit 9\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert clock.sm_clock_reader(3)() == 1755
    assert clock.sm_clock_reader(0)() is None  # the tool failed
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert clock.sm_clock_reader(3)() is None


def test_a_stop_cuts_the_runs_going_keeps_their_rows_and_starts_no_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--stop-s: the run still going is stopped with a row that says so, the one still queued
    is left (its row says why), and _run_all returns instead of waiting for either."""
    sleeper = tmp_path / "served_forever.py"  # stands in for bench/warm.py served
    sleeper.write_text("import time\ntime.sleep(120)\n")
    monkeypatch.setattr(sys.modules["smoke_run"], "WARM", str(sleeper))
    args = smoke._parser(None).parse_args(
        ["--device", "cpu", "--parallel", "1", "--stop-s", "1", "--config-timeout-s", "100"])
    queue = [SmokeConfig("tiny", "torch", 0), SmokeConfig("tiny", "torch", 3)]
    started = time.monotonic()
    done, left, why_left = smoke._run_all(list(queue), dict.fromkeys(queue), "cpu", 64 * GIB, args,
                                tmp_path)
    assert time.monotonic() - started < 30  # not the sleeper's 120 s, nor the 100 s timeout
    assert [r.config for r in done] == queue[:1] and left == queue[1:]
    assert done[0].note == "cut at --stop-s 1" and done[0].exit_code != 0
    assert why_left == "not run: cut at --stop-s 1"
