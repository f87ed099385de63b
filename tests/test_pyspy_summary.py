"""bench/lib/pyspy_summary.py: only the stacks under the chosen frame count, a wait on the GPU
is told apart from the host's own work, and a function deep in a stack is counted once per
sample however many of its frames the stack holds."""

from __future__ import annotations

from tests.bench_harness import load_script

summary = load_script("bench/lib/pyspy_summary.py")
function_of, read, report = summary.function_of, summary.read, summary.report

RAW = [
    "main (m.py:1);ServingLoop.run (loop.py:10);step (loop.py:20);Event.synchronize (s.py:5) 4\n",
    "main (m.py:1);ServingLoop.run (loop.py:10);step (loop.py:20);prepare (b.py:7) 5\n",
    "main (m.py:1);ServingLoop.run (loop.py:10);f (r.py:3);f (r.py:4);g (r.py:9) 1\n",
    "main (m.py:1);run_warmup (w.py:2);prepare (b.py:7) 90\n",
    "\n",
]


def test_only_the_serving_loop_counts_and_waits_are_apart() -> None:
    prof = read(RAW, "ServingLoop.run")
    assert prof.samples == 10 and prof.waiting == 4
    assert prof.inclusive["prepare (b.py)"] == 5  # the warmup's 90 left out
    assert prof.inclusive["f (r.py)"] == 1  # two frames of f, one sample
    assert prof.own["g (r.py:9)"] == 1
    text = report(prof, "ServingLoop.run", top=3)
    assert text.startswith("10 samples under ServingLoop.run; waiting on the GPU 4 (40.0 %)")
    assert "the host's own work 6 (60.0 %)" in text


def test_frames_without_a_line_and_no_samples() -> None:
    assert function_of("0x7f00 (libc.so.6)") == "0x7f00 (libc.so.6)"
    assert function_of("step (loop.py:20)") == "step (loop.py)"
    assert report(read(RAW, "nowhere"), "nowhere", top=3) == "no samples under nowhere"
