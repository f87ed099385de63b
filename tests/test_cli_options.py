"""The `warmgate` command line itself: options before or after the command, exit codes that
tell a typo from a timeout, validation, what `wait` last saw, `watch` waiting for a server,
the warmup progress bar and `--server-pid`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.grpc_harness import FakeEngine, ServerThread, server_config
from warmgate.client.cli import build_parser, main
from warmgate.client.exit_codes import (
    EXIT_FAILED,
    EXIT_LOCAL,
    EXIT_OK,
    EXIT_RPC_ERROR,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def cli(*argv: str, err: io.StringIO | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), err if err is not None else io.StringIO()
    try:
        with contextlib.redirect_stderr(err):  # where argparse writes usage errors
            code = main(list(argv), out=out, err=err, environ={})
    except SystemExit as exc:  # argparse: usage errors and --help
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_global_options_work_after_the_command() -> None:
    with ServerThread() as s:
        code, out, _ = cli("status", "--json", "--target", s.target)
        assert code == EXIT_OK and json.loads(out)["state"] == "WARMUP_STATE_PENDING"
        code, out, _ = cli("warmup", "--target", s.target, "--json")
        assert code == EXIT_OK and json.loads(out)["outcome"] == "WARMUP_OUTCOME_SUCCEEDED"
        code, out, _ = cli("wait", "--target", s.target, "--timeout", "5")
        assert (code, out.strip()) == (EXIT_OK, f"{s.target}: ready")
    args = build_parser({}).parse_args(["generate", "--prompt-ids", "1,2", "--json",
                                        "--target", "h:1", "--rpc-timeout", "3"])
    assert (args.json, args.target, args.rpc_timeout, args.prompt_ids) == (True, "h:1", 3.0,
                                                                             [1, 2])
    # Given before the command and not after, the value before stands.
    args = build_parser({}).parse_args(["--json", "--target", "h:2", "status"])
    assert (args.json, args.target) == (True, "h:2")


@pytest.mark.parametrize("argv", [
    ["statuss"],                                   # unknown command
    ["wait"],                                      # missing --timeout
    ["status", "--no-such-flag"],
    ["--timeout", "5", "status"],                  # --timeout means only wait's budget now
    ["--target", "localhost:99999", "status"],     # port out of range
    ["--target", "localhost", "status"],           # no port
    ["--target", "::1:50051", "status"],           # IPv6 without brackets
    ["generate", "--prompt-ids", "1,,2"],          # an empty id
    ["generate", "--prompt-ids", "1,-2"],
    ["generate", "--prompt-ids", ""],
    ["--server-pid", "abc", "status"],
    ["--rpc-timeout", "0", "status"],
    ["wait", "--timeout", "nan"],                  # was an instant "timeout", exit 2
    ["wait", "--timeout", "-5"],
    ["watch", "--connect-timeout", "nan"],
])
def test_a_bad_command_line_exits_64_not_2(argv: list[str]) -> None:
    code, out, err = cli(*argv)
    assert code == EXIT_USAGE and out == "" and "usage:" in err
    assert EXIT_USAGE not in (EXIT_OK, EXIT_FAILED, EXIT_TIMEOUT, EXIT_RPC_ERROR, EXIT_LOCAL)


def test_validation_messages_name_the_problem() -> None:
    assert "port must be 1..65535, got '99999'" in cli("--target", "h:99999", "status")[2]
    assert "'1,,2'" in cli("generate", "--prompt-ids", "1,,2")[2]
    args = build_parser({}).parse_args(["--target", "[::1]:50051", "status"])
    assert args.target == "[::1]:50051"
    assert build_parser({}).parse_args(["--target", "unix:/tmp/s", "status"]).target == \
        "unix:/tmp/s"


def test_local_errors_exit_4(tmp_path: object) -> None:
    code, _, err = cli("cache", "ls", "--cache-dir", "/nonexistent/warmgate-cache")
    assert code == EXIT_LOCAL and "does not exist" in err
    code, _, err = cli("--token-file", "/nonexistent/token", "status")
    assert code == EXIT_LOCAL and "cannot read /nonexistent/token" in err


def test_wait_says_what_it_last_saw() -> None:
    code, out, _ = cli("--target", f"127.0.0.1:{free_port()}", "wait", "--timeout", "0.5")
    assert code == EXIT_TIMEOUT
    assert "timeout (last seen: UNAVAILABLE:" in out and "onnect" in out, out
    with ServerThread() as s:  # never warmed up
        code, out, _ = cli("--target", s.target, "--json", "wait", "--timeout", "0.5")
        assert code == EXIT_TIMEOUT
        assert json.loads(out) == {"result": "timeout", "last_seen": "NOT_SERVING: state PENDING"}


def test_watch_waits_for_a_server_that_is_not_listening_yet() -> None:
    port = free_port()
    result: list[tuple[int, str, str]] = []
    watcher = threading.Thread(target=lambda: result.append(
        cli("--target", f"127.0.0.1:{port}", "watch", "--connect-timeout", "30")))
    watcher.start()
    time.sleep(1.0)
    assert watcher.is_alive() and not result  # still waiting, not failed at once
    with ServerThread(server_config("--port", str(port), "--warmup-on-start")):
        watcher.join(30)
    code, out, err = result[0]
    assert code == EXIT_OK, err
    assert out.strip().splitlines()[-1].startswith("state=READY")


def test_watch_gives_up_after_its_connect_timeout() -> None:
    start = time.monotonic()
    code, out, _ = cli("--target", f"127.0.0.1:{free_port()}", "watch",
                       "--connect-timeout", "0.5")
    assert code == EXIT_TIMEOUT and "last seen: UNAVAILABLE" in out
    assert time.monotonic() - start < 10


def test_warmup_draws_progress_on_a_terminal_only() -> None:
    engine = FakeEngine(steps=4, step_s=0.05)
    with ServerThread(engine=engine) as s:
        tty = Tty()
        code, out, _ = cli("--target", s.target, "warmup", err=tty)
        assert code == EXIT_OK and "outcome SUCCEEDED" in out
        bar = tty.getvalue()
        assert "\r\033[K[" in bar and "%" in bar and "kernels.decode" in bar, bar
        assert "[" not in out.splitlines()[0]  # the table on stdout stays clean
        code, out, err = cli("--target", s.target, "warmup", "--force")
        assert code == EXIT_OK and err == ""  # not a terminal: no bar
        code, out, _ = cli("--target", s.target, "--json", "warmup", "--force", err=tty)
        assert code == EXIT_OK and json.loads(out)["outcome"] == "WARMUP_OUTCOME_SUCCEEDED"


def test_server_pid_rejects_a_strangers_answer() -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with ServerThread(server_config("--warmup-on-start")) as s:
            # The in-process server is this test's own pid.
            ours = str(os.getpid())
            assert cli("--target", s.target, "--server-pid", ours, "wait",
                       "--timeout", "10")[0] == EXIT_OK
            assert cli("--target", s.target, "status", "--server-pid", ours)[0] == EXIT_OK
            code, out, _ = cli("--target", s.target, "--server-pid", str(other.pid), "wait",
                               "--timeout", "10")
            assert code == EXIT_RPC_ERROR
            assert f"not process {other.pid}: another server listens" in out
            code, _, err = cli("--target", s.target, "--server-pid", str(other.pid), "status")
            assert code == EXIT_RPC_ERROR and "another server listens" in err
            other.kill()
            other.wait()
            code, out, _ = cli("--target", s.target, "--server-pid", str(other.pid), "wait",
                               "--timeout", "10")
            assert code == EXIT_RPC_ERROR and f"server process {other.pid} is not running" in out
    finally:
        other.kill()
        other.wait()


def test_server_pid_comes_from_the_environment() -> None:
    assert build_parser({"WARMGATE_SERVER_PID": "42"}).parse_args(["status"]).server_pid == 42
    assert build_parser({}).parse_args(["status"]).server_pid is None
