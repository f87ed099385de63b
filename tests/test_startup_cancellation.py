"""SIGTERM during the start-up warmup is a cancellation, not an error: one INFO line.

Clients in flight (a WarmupKernels call waiting on the same run, a WatchStatus stream) must
not make the server log an error or grpc's "Exception not handled" either.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable

from tests.server_process import ServerProcess
from warmgate.client.api import WarmgateClient
from warmgate.client.errors import WarmgateRpcError

# Holds the plan inside kernels.decode long enough for the SIGTERM to land mid-warmup.
DELAY = {"WARMGATE_FAULT_INJECT": "kernels.decode:delay=3"}
STALL = re.compile(r"injecting fault delay in phase kernels\.decode")


def _call_in_background(fn: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        # UNAVAILABLE / CANCELLED while the server stops: expected
        with contextlib.suppress(WarmgateRpcError):
            fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_sigterm_during_warmup_logs_one_info_line_and_no_error() -> None:
    with ServerProcess(env=DELAY) as server:
        server.wait_for(STALL)
        with WarmgateClient(f"127.0.0.1:{server.port}", timeout=30) as client:
            waiters = [_call_in_background(lambda: client.warmup_kernels()),
                       _call_in_background(lambda: list(client.watch_status(follow=True)))]
            # Both RPCs are in the server once the forced run's watcher sees the plan.
            time.sleep(1.0)
            server.proc.send_signal(signal.SIGTERM)
            code = server.wait_exit(60)
            for thread in waiters:
                thread.join(10)
        log = server.log()
    assert code == 0, log
    assert "Traceback" not in log, log
    assert not re.search(r"\b(ERROR|CRITICAL)\b", log), log
    assert "Exception" not in log and "CancelledError" not in log, log
    cancelled = [line for line in log.splitlines() if "warmup cancelled" in line]
    assert len(cancelled) == 1 and " INFO " in cancelled[0], log
