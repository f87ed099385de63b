"""bench/load.py soak, small: 200 concurrent clients during forced warmups, a 1,000-call soak.

No timed assertions (bench prints the latencies); this proves the run is error-free, every
warmup in the burst succeeded and the server's memory did not run away. It runs the script
as a user does (tests/bench_harness.py) and reads its table.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.bench_harness import run_bench


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
def test_load_then_soak_has_no_errors() -> None:
    proc = run_bench("bench/load.py soak", ["--concurrency", "200", "--burst-per-client", "2",
                                            "--soak", "1000", "--channels", "2"], timeout=150)
    table = proc.stdout + proc.stderr
    assert proc.returncode == 0, table  # exit 1 when any call failed
    assert "errors: 0 (none)" in table, table
    counts = re.search(r"burst [\d.]+ req/s \((\d+) in .*soak [\d.]+ req/s \((\d+) in ", table)
    assert counts is not None and counts.groups() == ("400", "1000"), table
    warmups = re.search(r"forced warmups during the burst: (.*)", table)
    assert warmups is not None, table
    assert {w.rsplit(" ", 1)[0] for w in warmups.group(1).split(", ")} == {
        "WARMUP_OUTCOME_SUCCEEDED"}, table
    rss = re.search(r"server RSS: .*\(([+-][\d.]+) MiB\)", table)
    assert rss is not None and float(rss.group(1)) < 64, table
