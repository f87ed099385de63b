"""Telling our own server's answers from a stranger's: `--server-pid PID`.

A shell that starts `warmgate-server &` and then talks to its port may reach another process
listening there (ours failed to bind, or has not bound yet). GetStatus reports the server's
process id; a client given the pid it started checks both that the process still runs and
that the answering server is that process.
"""

from __future__ import annotations

import os

from warmgate.v1 import warmup_pb2 as pb


class ServerIdentityError(Exception):
    """The expected server process exited, or another process answered on the target."""


def check_process_alive(pid: int) -> None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise ServerIdentityError(f"server process {pid} is not running (it exited; see its "
                                  "log)") from None
    except PermissionError:  # it exists, owned by another user
        pass


def check_server_pid(status: pb.WarmupStatus, pid: int) -> None:
    if status.server_pid != pid:
        who = f"process {status.server_pid}" if status.server_pid else \
            "a server that does not report its pid"
        raise ServerIdentityError(f"the server answering is {who}, not process {pid}: "
                                  "another server listens on this address")
