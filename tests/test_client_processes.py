"""bench/lib/client_processes.py: how the streams in flight are split over client processes,
and a process that dies without its results ending the load rather than hanging it.
(tests/test_throughput_bench.py runs a closed loop over two processes against a server.)"""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest

from tests.bench_harness import load_script

bench = load_script("bench/lib/client_processes.py")


def test_the_streams_in_flight_stay_the_callers_figure() -> None:
    assert bench.shares(5, 2) == [3, 2]
    assert bench.shares(128, 3) == [43, 43, 42]
    assert sum(bench.shares(128, 3)) == 128
    assert bench.shares(None, 3) == [None, None, None]  # no cap: none in any process
    with pytest.raises(ValueError, match="at least as many streams"):
        bench.shares(1, 2)


def test_no_processes_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        bench.run_load_processes("127.0.0.1:1", [], processes=0)


def test_a_process_that_exits_without_results_ends_the_load() -> None:
    out: queue.Queue[list[object]] = queue.Queue()
    out.put(["results of the first"])
    workers = [SimpleNamespace(exitcode=0), SimpleNamespace(exitcode=1)]
    with pytest.raises(RuntimeError, match="exited with 1"):
        bench._collect(out, workers)
    out.put(["a"])
    out.put(["b"])
    assert bench._collect(out, [SimpleNamespace(exitcode=None)] * 2) == [["a"], ["b"]]
