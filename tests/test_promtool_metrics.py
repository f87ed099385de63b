"""A live scrape of the real server passes `promtool check metrics`.

The server runs in-process on 127.0.0.1 with free ports and the tiny model, warms up on start,
answers a few RPCs (so the RPC counters and histograms have series), and its /metrics page is
fed to promtool, Prometheus' own linter for names, units, suffixes and HELP text. promtool comes
from Debian's prometheus package; .ci/deploy-checks installs it, elsewhere this test skips.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from tests.grpc_harness import ServerThread, server_config
from warmgate.client.api import WaitResult, WarmgateClient

SCRAPE_TIMEOUT_S = 10.0
# Names deploy/README.md's metrics table promises (the families promtool sees; counters carry
# _total).
EXPECTED = ("warmgate_phase_duration_seconds", "warmgate_phase_skipped_total",
            "warmgate_warmup_state", "warmgate_ready", "warmgate_jit_compiles_total",
            "warmgate_compile_cache_hits_total", "warmgate_compile_cache_misses_total",
            "warmgate_rpc_requests_total", "warmgate_rpc_duration_seconds")


def promtool() -> str | None:
    return os.environ.get("PROMTOOL") or shutil.which("promtool")


@pytest.fixture(scope="module")
def scrape() -> Iterator[str]:
    with ServerThread(server_config("--warmup-on-start")) as server:
        with WarmgateClient(server.target, timeout=SCRAPE_TIMEOUT_S) as client:
            assert client.wait_ready(60.0) is WaitResult.READY
            client.get_status()
        url = f"http://127.0.0.1:{server.running.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            assert response.status == 200
            yield response.read().decode()


def test_scrape_has_every_documented_family_with_samples_after_warmup(scrape: str) -> None:
    typed = set(re.findall(r"^# TYPE (\S+) ", scrape, re.MULTILINE))
    assert set(EXPECTED) <= typed
    assert re.search(r"^warmgate_ready 1\.0$", scrape, re.MULTILINE)
    assert re.search(r'^warmgate_warmup_state\{state="ready"\} 1\.0$', scrape, re.MULTILINE)
    assert re.search(r'^warmgate_phase_duration_seconds_bucket\{le="\+Inf",'
                     r'phase="kernels.prefill"\} 1\.0$', scrape, re.MULTILINE)
    assert re.search(r"^warmgate_rpc_requests_total\{", scrape, re.MULTILINE)
    assert all(name.startswith("warmgate_") for name in typed if "_created" not in name)


def test_promtool_check_metrics_accepts_the_live_scrape(scrape: str) -> None:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (.ci/deploy-checks installs it)")
    proc = subprocess.run([tool, "check", "metrics"], input=scrape, capture_output=True,
                          text=True, timeout=60, check=False)
    # promtool exits 0 with no output when every metric passes its lint.
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, ""), proc.stdout + proc.stderr
