"""bench/start.py profile: a sample is counted for the seconds it stands for, at the line a
thread was on and for every function of its stack; and a whole warm-up-only start on the CPU
is profiled, its table printed, its exit code kept."""

from __future__ import annotations

import sys
import threading

from tests.bench_harness import load_script, run_bench


def _parked_inner(release: threading.Event, parked: threading.Event) -> None:
    parked.set()
    release.wait()


def _parked_outer(release: threading.Event, parked: threading.Event) -> None:
    _parked_inner(release, parked)


def test_a_sample_counts_its_seconds_where_the_thread_was_and_for_its_callers() -> None:
    bench = load_script("bench/lib/startup_profile.py")
    release, parked = threading.Event(), threading.Event()
    thread = threading.Thread(target=_parked_outer, args=(release, parked), name="parked")
    thread.start()
    try:
        assert parked.wait(10)
        sampler = bench.StackSampler(0.001)
        frames = {thread.ident: sys._current_frames()[thread.ident]}
        sampler.sample(frames, {thread.ident: "parked"}, 0.25)
        sampler.sample(frames, {thread.ident: "parked"}, 0.5)
    finally:
        release.set()
        thread.join()
    (leaf, seconds), = sampler.leaf["parked"].items()
    assert "threading.py" in leaf and seconds == 0.75  # Event.wait's line, both samples
    inside = {where.split(" ")[-1]: s for where, s in sampler.inside["parked"].items()}
    assert inside["_parked_inner"] == inside["_parked_outer"] == 0.75
    lines = bench.report(sampler, top=10, wall_s=1.0)
    assert lines[1] == "thread parked: 0.75 s sampled"
    assert any("_parked_outer" in line for line in lines)
    (stack, seconds), = sampler.stacks["parked"].items()  # the same stack both times
    names = [where.split(" ")[-1] for where in stack.split(" <- ")]
    assert seconds == 0.75 and len(names) <= bench.STACK_DEPTH  # a thread has 7 here
    assert names.index("_parked_outer") == names.index("_parked_inner") + 1  # its caller


def test_a_cpu_start_is_profiled_end_to_end() -> None:
    proc = run_bench("bench/start.py profile",
                     ["--interval-ms", "5", "--top", "3", "--", "--model", "tiny",
                      "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    assert "outcome SUCCEEDED" in proc.stdout
    assert "thread MainThread:" in proc.stdout and "server/main.py:" in proc.stdout
    assert "garbage collector:" in proc.stdout


def test_the_collector_timer_counts_each_pass_by_generation() -> None:
    bench = load_script("bench/lib/startup_profile.py")
    timer = bench.CollectorTimer()
    timer("start", {"generation": 2})
    timer("stop", {"generation": 2})
    timer("start", {"generation": 0})
    timer("stop", {"generation": 0})
    timer("start", {"generation": 0})
    timer("stop", {"generation": 0})
    assert timer.count == {0: 2, 2: 1}
    lines = timer.lines()
    assert lines[0].startswith("garbage collector: 3 passes")
    assert lines[1].startswith("  generation 0: 2 passes")
    assert lines[2].startswith("  generation 2: 1 passes")
