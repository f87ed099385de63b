"""bench/warm.py kernel-map-touch: the sizes it times are ones no map kept (else the first call
would be warm by construction and the check would prove nothing), and it refuses to run off the GPU
with one line and exit 2."""

from __future__ import annotations

from types import ModuleType

from tests.bench_harness import load_script, run_bench


def _bench() -> ModuleType:
    return load_script("bench/lib/kernel_map_touch.py")


# Kernels per size: a, then the same a with a split-K reduce r, then b; a alone again at 7.
SIGS = [["a"], ["a"], ["a", "r"], ["r", "a"], ["a", "r"], ["b"], ["a"], ["b"], ["b"], ["b"]]


def test_the_policies_keep_what_each_rule_says() -> None:
    bench = _bench()
    assert bench.policy_sizes("every", SIGS) == list(range(1, 11))
    assert bench.policy_sizes("sequences", SIGS) == [1, 3, 4, 6, 10]
    assert bench.policy_sizes("kept", SIGS) == [1, 3, 6, 10]
    assert bench.policy_sizes("none", SIGS) == []
    assert bench.policy_sizes("thread", SIGS) == list(range(1, 11))  # every size, elsewhere


def test_only_sizes_no_map_kept_are_timed() -> None:
    bench = _bench()
    picked = bench.pick_test_sizes({"f": {"k": SIGS}}, samples=50, seed=1)
    assert picked == {"f": {"k": [2, 5, 7, 8, 9]}}
    assert len(bench.pick_test_sizes({"f": {"k": SIGS}}, samples=2, seed=1)["f"]["k"]) == 2


def test_off_the_gpu_it_exits_2_with_one_line() -> None:
    proc = run_bench("bench/warm.py kernel-map-touch", ["--model", "llama-3.2-1b"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--device cuda" in proc.stderr
