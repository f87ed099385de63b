"""The `warmgate` CLI's exit codes: stable, as scripts, probes and init containers branch on
them. README.md's Client section shows the same table.

  0   success: ready, or the warmup succeeded
  1   the warmup failed (its outcome FAILED, or GetStatus says FAILED)
  2   `wait` (or `watch` waiting for the server) timed out
  3   the server answered with an error, was unreachable, or is not the --server-pid process
  4   a local problem: a missing file, directory or optional dependency (matplotlib), or
      nothing to draw; no warmup is implied either way
  64  a bad command line (EX_USAGE): unknown option, bad value
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_TIMEOUT = 2
EXIT_RPC_ERROR = 3
EXIT_LOCAL = 4
EXIT_USAGE = 64
EXIT_INTERRUPTED = 130

# One line per code for `warmgate --help`.
EPILOG = ("exit codes: 0 ok/ready, 1 warmup failed, 2 wait timed out, 3 RPC error or wrong "
          "server, 4 local error (file, directory, dependency), 64 bad command line, "
          "130 interrupted")
