"""bench/serve.py decode-latency --pdl, the part a CPU can check: `both` times each backend
without --pdl, then with it, and the table puts each graphed step with PDL beside the same
backend's without."""

from __future__ import annotations

from tests.bench_harness import load_script


def test_both_arms_run_off_first_then_on() -> None:
    bench = load_script("bench/lib/decode_latency.py")
    assert bench.PDL_ARMS == {"off": (False,), "on": (True,), "both": (False, True)}


def test_the_pdl_table_pairs_each_backend_with_itself() -> None:
    bench = load_script("bench/lib/decode_latency.py")
    results = {"torch": {"eager": {1: 9.0}, "graph": {1: 8.0}},
               "triton": {"eager": {1: 8.0, 8: 9.0}, "graph": {1: 7.0, 8: 8.0}},
               "triton/pdl": {"eager": {1: 7.0, 8: 8.5}, "graph": {1: 5.6, 8: 8.0}}}
    rows = bench.pdl_table(results).splitlines()
    assert rows[0].split() == ["backend", "batch", "graph", "graph/pdl", "pdl/off"]
    assert [r.split() for r in rows[1:]] == [["triton", "1", "7.000", "5.600", "0.80"],
                                             ["triton", "8", "8.000", "8.000", "1.00"]]
