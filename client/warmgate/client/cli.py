"""`warmgate`: trigger warmup on a warmgate server and wait for it, from a shell or a probe.

Exit codes (stable; scripts and init containers branch on them):
  0  success: ready, or the warmup succeeded
  1  the warmup failed (WarmupKernels/MixedWarmup outcome FAILED, or GetStatus says FAILED)
  2  `wait` timed out (also argparse's code for a bad command line)
  3  the server answered with an error (printed with its field violations) or was unreachable
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from warmgate.client import render
from warmgate.client.api import DEFAULT_TARGET, WaitResult, WarmgateClient
from warmgate.client.cache_cmd import add_cache_command, run_cache
from warmgate.client.errors import WarmgateRpcError
from warmgate.client.generate_cmd import add_generate_command, run_generate
from warmgate.client.report_cmd import add_report_command, run_report
from warmgate.client.security import (
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TLS_SERVER_NAME,
    ENV_TOKEN_FILE,
    ClientSecurity,
)
from warmgate.v1 import warmup_pb2 as pb

EXIT_OK, EXIT_FAILED, EXIT_TIMEOUT, EXIT_RPC_ERROR = 0, 1, 2, 3
# Deadlines per command when --timeout is not given: a cold warmup of a large model on a GPU
# can take many minutes (the phase histogram's buckets go to 30 minutes).
WARMUP_TIMEOUT_S = 1800.0
STATUS_TIMEOUT_S = 10.0


def _add_security_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
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
        group.add_argument(flag, default=environ.get(env) or None, metavar="PATH"
                           if flag != "--tls-server-name" else "NAME",
                           help=f"{text} (env {env})")
    group.add_argument("--tls", action="store_true",
                       help="TLS with the system's CA roots (implied by --tls-ca/--tls-cert)")


def _security(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ClientSecurity:
    try:
        return ClientSecurity.from_files(
            token_file=args.token_file, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
            tls_key=args.tls_key, tls=args.tls, server_name=args.tls_server_name)
    except OSError as exc:
        parser.error(f"cannot read {exc.filename}: {exc.strerror}")
    except ValueError as exc:
        parser.error(str(exc))


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="warmgate", description="Warm up a warmgate server's kernels and wait for it.",
        epilog="exit codes: 0 ok/ready, 1 warmup failed, 2 wait timed out, 3 RPC error",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET, help="host:port of the server "
                        f"(default {DEFAULT_TARGET})")
    parser.add_argument("--json", action="store_true", help="print JSON (one object per line)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help=f"deadline of each RPC in seconds (default {WARMUP_TIMEOUT_S:.0f} "
                             f"for warmup and mixed, {STATUS_TIMEOUT_S:.0f} for status)")
    _add_security_flags(parser, environ)
    commands = parser.add_subparsers(dest="command", required=True)

    warmup = commands.add_parser("warmup", help="run the warmup plan and print its report")
    warmup.add_argument("--force", action="store_true", help="run again even after a success")
    warmup.add_argument("--mixed-num-tokens", type=int, default=None, metavar="N",
                        help="tokens of the mixed phase (default: the server's)")

    mixed = commands.add_parser("mixed", help="run only the mixed prefill+decode warmup")
    mixed.add_argument("--num-tokens", type=int, required=True, metavar="N")
    mixed.add_argument("--force", action="store_true", help="run again even after a success")

    commands.add_parser("status", help="print the warmup state and the last report")

    watch = commands.add_parser("watch", help="follow warmup progress until it settles")
    watch.add_argument("--follow", action="store_true",
                       help="keep watching after READY/FAILED (until interrupted)")

    wait = commands.add_parser("wait", help="block until the server is ready (health SERVING)")
    wait.add_argument("--timeout", dest="wait_timeout", type=float, required=True, metavar="S",
                      help="give up after S seconds (exit 2)")
    wait.add_argument("--service", default="", help="health service name (default: server)")
    add_report_command(commands)
    add_cache_command(commands, environ)
    add_generate_command(commands)
    return parser


def _report_exit(report: pb.WarmupReport) -> int:
    return EXIT_OK if report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED else EXIT_FAILED


def _cmd_warmup(client: WarmgateClient, args: argparse.Namespace, out: TextIO) -> int:
    report = client.warmup_kernels(args.force, args.mixed_num_tokens,
                                   timeout=args.timeout or WARMUP_TIMEOUT_S)
    print(render.to_json(report) if args.json else render.report_table(report), file=out)
    return _report_exit(report)


def _cmd_mixed(client: WarmgateClient, args: argparse.Namespace, out: TextIO) -> int:
    report = client.mixed_warmup(args.num_tokens, args.force,
                                 timeout=args.timeout or WARMUP_TIMEOUT_S)
    print(render.to_json(report) if args.json else render.report_table(report), file=out)
    return _report_exit(report)


def _cmd_status(client: WarmgateClient, args: argparse.Namespace, out: TextIO) -> int:
    status = client.get_status(timeout=args.timeout or STATUS_TIMEOUT_S)
    print(render.to_json(status) if args.json else render.status_text(status), file=out)
    return EXIT_FAILED if status.state == pb.WARMUP_STATE_FAILED else EXIT_OK


def _cmd_watch(client: WarmgateClient, args: argparse.Namespace, out: TextIO) -> int:
    live = out.isatty() and not args.json
    last: pb.WarmupStatus | None = None
    shown: tuple[int, str, int, int] | None = None
    for status in client.watch_status(args.follow, timeout=args.timeout):
        last = status
        if args.json:
            print(render.to_json(status), file=out, flush=True)
        elif live:  # redraw one line in place
            print("\r\033[K" + render.progress_bar(status), end="", file=out, flush=True)
        else:
            # Heartbeats repeat the same phase and steps; a log wants a line per change.
            key = (status.state, status.current_phase, status.steps_done, status.steps_total)
            if key != shown:
                print(render.status_line(status), file=out, flush=True)
                shown = key
    if live:
        print(file=out)
    if last is not None and last.state == pb.WARMUP_STATE_FAILED:
        if not args.json:
            print(f"warmup failed: {last.failure_reason}", file=out)
        return EXIT_FAILED
    return EXIT_OK


def _cmd_wait(client: WarmgateClient, args: argparse.Namespace, out: TextIO) -> int:
    result = client.wait_ready(args.wait_timeout, service=args.service)
    if args.json:
        print(f'{{"result": "{result.value}"}}', file=out)
    else:
        print(f"{args.target}: {result.value}", file=out)
    return {WaitResult.READY: EXIT_OK, WaitResult.FAILED: EXIT_FAILED,
            WaitResult.TIMEOUT: EXIT_TIMEOUT}[result]


_COMMANDS: dict[str, Callable[[WarmgateClient, argparse.Namespace, TextIO], int]] = {
    "warmup": _cmd_warmup, "mixed": _cmd_mixed, "status": _cmd_status, "watch": _cmd_watch,
    "wait": _cmd_wait,
    "report": lambda client, args, out: run_report(args, lambda: client, out=out),
}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    if args.command == "cache":  # a local directory: no server, no channel
        return run_cache(args, out=out, err=err, as_json=args.json)
    security = _security(parser, args)
    try:
        with WarmgateClient(args.target, timeout=args.timeout, security=security) as client:
            if args.command == "generate":
                return run_generate(client, args, out, err)
            return _COMMANDS[args.command](client, args, out)
    except WarmgateRpcError as exc:
        print(f"warmgate: {args.target}: {exc}", file=err)
        return EXIT_RPC_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
