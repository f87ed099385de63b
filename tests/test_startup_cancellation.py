"""SIGTERM during the start-up warmup is a cancellation, not an error: one INFO line.

Clients in flight (a WarmupKernels call joined to the run, a MixedWarmup queued behind it, a
WatchStatus stream) must not make the server log an error, a traceback, or grpc's
"Exception not handled ... CancelledError", whether the runner reaches its next step within
the grace or is left behind when the grace runs out.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable

import pytest

from warmgate.client.api import WarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.devtools.server_process import ServerProcess

STALL = re.compile(r"injecting fault delay in phase kernels\.decode")


def _call_in_background(fn: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        # UNAVAILABLE / CANCELLED while the server stops: expected
        with contextlib.suppress(WarmgateRpcError):
            fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# (seconds the decode phase stalls, --shutdown-grace): the step ends within the grace, or not.
@pytest.mark.parametrize(("delay", "grace"), [("3", "5"), ("6", "1")],
                         ids=["step-ends-in-grace", "grace-runs-out"])
def test_sigterm_during_warmup_logs_one_info_line_and_no_error(delay: str, grace: str) -> None:
    env = {"WARMGATE_FAULT_INJECT": f"kernels.decode:delay={delay}"}
    with ServerProcess(["--shutdown-grace", grace], env=env) as server:
        server.wait_for(STALL)
        with WarmgateClient(f"127.0.0.1:{server.port}", timeout=30) as client:
            waiters = [_call_in_background(lambda: client.warmup_kernels()),
                       _call_in_background(lambda: client.mixed_warmup(8)),
                       _call_in_background(lambda: list(client.watch_status(follow=True)))]
            time.sleep(1.0)  # the three RPCs reach the server and wait on the runner
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
