"""`warmgate-server` as a process: warms up on start, answers health, stops on SIGTERM."""

from __future__ import annotations

import re
import signal

from warmgate.client.api import WaitResult, WarmgateClient
from warmgate.server.devtools.server_process import ServerProcess


def test_server_process_warms_up_on_start_and_stops_on_sigterm() -> None:
    with ServerProcess() as server:
        with WarmgateClient(server.target, timeout=10) as client:
            assert client.wait_ready(30) is WaitResult.READY
            assert client.get_status().last_report.phases[0].name == "load"
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait_exit(30) == 0, server.log()
        log = server.log()
    # One line per phase, with its status, seconds, reason and shapes.
    assert re.search(r"phase=kernels\.prefill status=RAN seconds=\d+\.\d+ reason=- shapes=\{",
                     log), log
    assert "phase=cuda_graphs status=SKIPPED" in log and "reason=NO_CUDA" in log
    assert "stopped" in log
