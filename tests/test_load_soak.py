"""bench/load_soak.py, small: 200 concurrent clients during forced warmups, a 1,000-call soak.

No timed assertions (bench prints the latencies); this proves the run is error-free, every
warmup in the burst succeeded and the server's memory did not run away.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from bench.load_soak import ServerProcess, run_load, table


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
def test_load_then_soak_has_no_errors() -> None:
    server = ServerProcess([])
    try:
        result = asyncio.run(asyncio.wait_for(run_load(
            server, concurrency=200, burst_per_client=2, soak=1000, channels=2), 90))
    finally:
        server.close()
    assert result.errors == 0, table(result)
    assert (result.burst.count, result.soak.count) == (400, 1000)
    assert set(result.warmups) == {"WARMUP_OUTCOME_SUCCEEDED"}, result.warmups
    assert result.rss_after_mib - result.rss_before_mib < 64, table(result)
