"""`warmgate`: trigger warmup on a warmgate server and wait for it, from a shell or a probe.

Exit codes: see warmgate.client.exit_codes (0 ok, 1 warmup failed, 2 timed out, 3 RPC error
or wrong server, 4 local error, 64 bad command line, 130 interrupted).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from warmgate.client import render, sampling_flags
from warmgate.client.api import WaitOutcome, WaitResult, WarmgateClient
from warmgate.client.cache_cmd import add_cache_command, run_cache
from warmgate.client.cli_options import (
    STATUS_TIMEOUT_S,
    WARMUP_TIMEOUT_S,
    Parser,
    add_global_options,
    environment,
    positive_seconds,
)
from warmgate.client.errors import WarmgateRpcError
from warmgate.client.exit_codes import (
    EPILOG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_LOCAL,
    EXIT_OK,
    EXIT_RPC_ERROR,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from warmgate.client.generate_cmd import add_generate_command, run_generate
from warmgate.client.identity import ServerIdentityError
from warmgate.client.report_cmd import add_report_command, run_report
from warmgate.client.security import ClientSecurity
from warmgate.v1 import warmup_pb2 as pb

__all__ = ["EXIT_FAILED", "EXIT_LOCAL", "EXIT_OK", "EXIT_RPC_ERROR", "EXIT_TIMEOUT",
           "EXIT_USAGE", "build_parser", "main"]

# How long `watch` waits for a server that is not listening yet, unless --connect-timeout.
WATCH_CONNECT_TIMEOUT_S = 60.0
_WAIT_EXIT = {WaitResult.READY: EXIT_OK, WaitResult.FAILED: EXIT_FAILED,
              WaitResult.TIMEOUT: EXIT_TIMEOUT, WaitResult.WRONG_SERVER: EXIT_RPC_ERROR}


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    environ = environment(environ)
    parser = Parser(prog="warmgate", description="Warm up a warmgate server's kernels and "
                    "wait for it. Options shown here go before or after the command.",
                    epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_global_options(parser, environ, suppress=False)
    commands = parser.add_subparsers(dest="command", required=True)

    warmup = commands.add_parser("warmup", help="run the warmup plan and print its report "
                                 "(a progress bar on stderr when it is a terminal)")
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
    watch.add_argument("--connect-timeout", type=positive_seconds, default=WATCH_CONNECT_TIMEOUT_S,
                       metavar="S", help="wait up to S seconds for the server to start "
                       f"listening (default {WATCH_CONNECT_TIMEOUT_S:.0f}; exit 2)")

    wait = commands.add_parser("wait", help="block until the server is ready (health SERVING)")
    wait.add_argument("--timeout", dest="wait_timeout", type=positive_seconds, required=True,
                      metavar="S", help="give up after S seconds (exit 2)")
    wait.add_argument("--service", default="", help="health service name (default: server)")
    add_report_command(commands)
    add_cache_command(commands, environ)
    add_generate_command(commands)
    for command in commands.choices.values():
        add_global_options(command, environ, suppress=True)
    return parser


def _report_exit(report: pb.WarmupReport) -> int:
    return EXIT_OK if report.outcome == pb.WARMUP_OUTCOME_SUCCEEDED else EXIT_FAILED


def _progress(args: argparse.Namespace, err: TextIO) -> Callable[[pb.WarmupStatus], None] | None:
    """The live bar `watch` draws, redrawn on stderr, when stderr is a terminal."""
    if args.json or not err.isatty():
        return None
    return lambda status: print("\r\033[K" + render.progress_bar(status), end="", file=err,
                                flush=True)


def _print_report(report: pb.WarmupReport, args: argparse.Namespace, out: TextIO,
                  err: TextIO) -> int:
    if _progress(args, err) is not None:
        print("\r\033[K", end="", file=err, flush=True)
    print(render.to_json(report) if args.json else render.report_table(report), file=out)
    return _report_exit(report)


def _cmd_warmup(client: WarmgateClient, args: argparse.Namespace, out: TextIO,
                err: TextIO) -> int:
    report = client.warmup_kernels(args.force, args.mixed_num_tokens,
                                   timeout=args.rpc_timeout or WARMUP_TIMEOUT_S,
                                   on_progress=_progress(args, err))
    return _print_report(report, args, out, err)


def _cmd_mixed(client: WarmgateClient, args: argparse.Namespace, out: TextIO,
               err: TextIO) -> int:
    report = client.mixed_warmup(args.num_tokens, args.force,
                                 timeout=args.rpc_timeout or WARMUP_TIMEOUT_S,
                                 on_progress=_progress(args, err))
    return _print_report(report, args, out, err)


def _cmd_status(client: WarmgateClient, args: argparse.Namespace, out: TextIO,
                err: TextIO) -> int:
    status = client.get_status(timeout=args.rpc_timeout or STATUS_TIMEOUT_S)
    print(render.to_json(status) if args.json else render.status_text(status), file=out)
    return EXIT_FAILED if status.state == pb.WARMUP_STATE_FAILED else EXIT_OK


def _print_wait(outcome: WaitOutcome, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        print(json.dumps({"result": outcome.result.value, "last_seen": outcome.last_seen}),
              file=out)
    elif outcome.result is WaitResult.READY:
        print(f"{args.target}: ready", file=out)
    else:
        print(f"{args.target}: {outcome.result.value} (last seen: {outcome.last_seen})",
              file=out)
    return _WAIT_EXIT[outcome.result]


def _cmd_watch(client: WarmgateClient, args: argparse.Namespace, out: TextIO,
               err: TextIO) -> int:
    answering = client.wait_answering(args.connect_timeout)
    if answering.result is not WaitResult.READY:
        return _print_wait(answering, args, out)
    if args.server_pid is not None:
        client.check_server(args.server_pid, timeout=args.rpc_timeout or STATUS_TIMEOUT_S)
    live = out.isatty() and not args.json
    last: pb.WarmupStatus | None = None
    shown: tuple[int, str, int, int] | None = None
    for status in client.watch_status(args.follow, timeout=args.rpc_timeout):
        last = status
        if args.json:
            print(render.to_json(status), file=out, flush=True)
        elif live:  # redraw one line in place
            print("\r\033[K" + render.progress_bar(status), end="", file=out, flush=True)
        else:
            # Heartbeats repeat the same phase and steps; a log wants a line per change.
            key = (status.state, status.current_phase, status.steps_done, status.steps_total)
            if key != shown:
                print(render.watch_line(status), file=out, flush=True)
                shown = key
    if live:  # the bar's last state, then the settled line a log would have shown
        print(file=out)
        if last is not None and last.state in render.SETTLED:
            print(render.watch_line(last), file=out)
    if last is not None and last.state == pb.WARMUP_STATE_FAILED:
        if not args.json:
            print(f"warmup failed: {last.failure_reason}", file=out)
        return EXIT_FAILED
    return EXIT_OK


def _cmd_wait(client: WarmgateClient, args: argparse.Namespace, out: TextIO,
              err: TextIO) -> int:
    return _print_wait(client.wait(args.wait_timeout, args.service,
                                   server_pid=args.server_pid), args, out)


_COMMANDS: dict[str, Callable[[WarmgateClient, argparse.Namespace, TextIO, TextIO], int]] = {
    "warmup": _cmd_warmup, "mixed": _cmd_mixed, "status": _cmd_status, "watch": _cmd_watch,
    "wait": _cmd_wait, "generate": run_generate,
    "report": lambda client, args, out, err: run_report(args, lambda: client, out=out, err=err),
}


def _security(args: argparse.Namespace) -> ClientSecurity:
    """ClientSecurity from the flags; raises OSError (a local error) or ValueError (usage)."""
    return ClientSecurity.from_files(
        token_file=args.token_file, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
        tls_key=args.tls_key, tls=args.tls, server_name=args.tls_server_name)


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    if args.command == "generate" and (problem := sampling_flags.cross_check(args)):
        parser.error(problem)
    if args.command == "cache":  # a local directory: no server, no channel
        return run_cache(args, out=out, err=err, as_json=args.json)
    try:
        security = _security(args)
    except OSError as exc:
        print(f"warmgate: cannot read {exc.filename}: {exc.strerror}", file=err)
        return EXIT_LOCAL
    except ValueError as exc:
        parser.error(str(exc))
    try:
        with WarmgateClient(args.target, timeout=args.rpc_timeout, security=security) as client:
            # `wait` and `watch` check the pid themselves, while the server comes up.
            if args.server_pid is not None and args.command not in ("wait", "watch"):
                client.check_server(args.server_pid, timeout=args.rpc_timeout or
                                    STATUS_TIMEOUT_S)
            return _COMMANDS[args.command](client, args, out, err)
    except ServerIdentityError as exc:
        print(f"warmgate: {args.target}: {exc}", file=err)
        return EXIT_RPC_ERROR
    except WarmgateRpcError as exc:
        print(f"warmgate: {args.target}: {exc}", file=err)
        return EXIT_RPC_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
