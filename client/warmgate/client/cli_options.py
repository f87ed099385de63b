"""The `warmgate` command line's options that every command shares, and its parser class.

Global options are accepted before or after the subcommand (`warmgate --json status` and
`warmgate status --json` mean the same): each subcommand gets a copy of them whose defaults
are argparse.SUPPRESS, so a copy that was not given leaves the value parsed before the
subcommand alone. A bad command line exits EXIT_USAGE (64, BSD's EX_USAGE), never 2 (a
`wait` timeout).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from warmgate.client.api import DEFAULT_TARGET
from warmgate.client.exit_codes import EXIT_USAGE
from warmgate.client.security import (
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TLS_SERVER_NAME,
    ENV_TOKEN_FILE,
)

ENV_SERVER_PID = "WARMGATE_SERVER_PID"
# Deadlines per command when --rpc-timeout is not given: a cold warmup of a large model on a
# GPU can take many minutes (the phase histogram's buckets go to 30 minutes).
WARMUP_TIMEOUT_S = 1800.0
STATUS_TIMEOUT_S = 10.0
# Schemes gRPC resolves itself (dns:///h:p, unix:/path, ipv4:, ipv6:, ...): passed through.
_SCHEME_PREFIXES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")


class Parser(argparse.ArgumentParser):
    """argparse with EX_USAGE as the exit code of a bad command line."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def target(text: str) -> str:
    """host:port (IPv6 in brackets) with a port in 1..65535, or a gRPC scheme URI."""
    if text.startswith(_SCHEME_PREFIXES):
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or (":" in host and not host.startswith("[")):
        raise argparse.ArgumentTypeError(
            f"expected host:port (IPv6 as [::1]:50051), got {text!r}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {port!r} in {text!r}")
    return text


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a process id (a positive integer), "
                                         f"got {text!r}")
    return int(text)


def positive_seconds(text: str) -> float:
    """An argparse type: seconds > 0 (NaN and negative values are usage errors)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def add_global_options(parser: argparse.ArgumentParser, environ: Mapping[str, str], *,
                       suppress: bool) -> None:
    """The shared options; `suppress` for the per-subcommand copies (see the module doc)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--target", type=target, default=default(DEFAULT_TARGET),
                        help=f"host:port of the server (default {DEFAULT_TARGET})")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print JSON (one object per line)")
    parser.add_argument("--rpc-timeout", type=positive_seconds, default=default(None), metavar="S",
                        help=f"deadline of each RPC in seconds (default {WARMUP_TIMEOUT_S:.0f} "
                             f"for warmup and mixed, {STATUS_TIMEOUT_S:.0f} for status, none "
                             "for watch and generate)")
    # A string default goes through `type` too, so a bad environment value is a usage error.
    parser.add_argument("--server-pid", type=_pid,
                        default=default(environ.get(ENV_SERVER_PID) or None),
                        metavar="PID", help="fail unless the server answering is this process "
                        f"and it still runs (env {ENV_SERVER_PID}; for a server this shell "
                        "started: `warmgate-server ... & export WARMGATE_SERVER_PID=$!`)")
    group = parser.add_argument_group(
        "security", "TLS, mTLS and bearer tokens; each flag defaults to its environment variable")
    for flag, env, text in (
            ("--token-file", ENV_TOKEN_FILE, "file whose first token is sent as "
             "'authorization: Bearer <token>' (needed for warmup and mixed)"),
            ("--tls-ca", ENV_TLS_CA, "PEM CA bundle that signed the server's certificate "
             "(turns TLS on)"),
            ("--tls-cert", ENV_TLS_CERT, "PEM client certificate, for mTLS (turns TLS on)"),
            ("--tls-key", ENV_TLS_KEY, "PEM private key of --tls-cert"),
            ("--tls-server-name", ENV_TLS_SERVER_NAME, "name to check the server's "
             "certificate against when --target is an IP or an alias")):
        group.add_argument(flag, default=default(environ.get(env) or None),
                           metavar="NAME" if flag == "--tls-server-name" else "PATH",
                           help=f"{text} (env {env})")
    group.add_argument("--tls", action="store_true", default=default(False),
                       help="TLS with the system's CA roots (implied by --tls-ca/--tls-cert)")


def environment(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ
