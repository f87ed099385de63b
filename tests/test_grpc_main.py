"""`warmgate-server` as a process: warms up on start, answers health, stops on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from warmgate.client.api import WaitResult, WarmgateClient

ROOT = Path(__file__).resolve().parents[1]


def test_server_process_warms_up_on_start_and_stops_on_sigterm() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'client'}{os.pathsep}{ROOT / 'server'}",
           "WARMGATE_METRICS_PORT": "-1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "warmgate.server.main", "--host", "127.0.0.1", "--port", "0",
         "--device", "cpu"], env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r"serving warmgate\.v1\.Warmup on 127\.0\.0\.1:(\d+)", line)
            port = int(match.group(1)) if match else None
        assert port is not None, "".join(lines)
        with WarmgateClient(f"127.0.0.1:{port}", timeout=10) as client:
            assert client.wait_ready(30) is WaitResult.READY
            assert client.get_status().last_report.phases[0].name == "load"
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
        lines.append(rest)
        assert proc.returncode == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(lines)
    # One line per phase, with its status, seconds, reason and shapes.
    assert re.search(r"phase=kernels\.prefill status=RAN seconds=\d+\.\d+ reason=- shapes=\{",
                     log), log
    assert "phase=cuda_graphs status=SKIPPED" in log and "reason=NO_CUDA" in log
    assert "stopped" in log
