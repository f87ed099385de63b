"""The `warmgate` CLI against real servers: exit codes, output, errors, no torch needed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.grpc_harness import FakeEngine, ServerThread, server_config
from warmgate.client.cli import EXIT_FAILED, EXIT_OK, EXIT_RPC_ERROR, EXIT_TIMEOUT, main

ROOT = Path(__file__).resolve().parents[1]


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_wait_is_0_once_ready_and_warmup_prints_every_phase() -> None:
    with ServerThread() as s:
        code, out, _ = cli("--target", s.target, "warmup")
        assert code == EXIT_OK
        for phase in ("load", "kernels.prefill", "kernels.decode", "mixed", "cuda_graphs"):
            assert phase in out
        assert "NO_CUDA" in out and "outcome SUCCEEDED" in out
        code, out, _ = cli("--target", s.target, "wait", "--timeout", "5")
        assert (code, out.strip()) == (EXIT_OK, f"{s.target}: ready")
        code, out, _ = cli("--target", s.target, "--json", "status")
        assert code == EXIT_OK and json.loads(out)["state"] == "WARMUP_STATE_READY"


def test_wait_is_1_when_the_warmup_failed() -> None:
    with ServerThread(server_config("--warmup-on-start"),
                      FakeEngine(fail_phase="kernels.prefill")) as s:
        code, out, _ = cli("--target", s.target, "wait", "--timeout", "10")
        assert code == EXIT_FAILED
        assert out.strip() == f"{s.target}: failed (last seen: kernels.prefill: boom)"
        code, out, _ = cli("--target", s.target, "status")
        assert code == EXIT_FAILED and "kernels.prefill: boom" in out


def test_wait_is_2_on_timeout() -> None:
    with ServerThread() as s:  # never warmed up
        code, out, _ = cli("--target", s.target, "wait", "--timeout", "0.5")
        assert (code, out.strip()) == (EXIT_TIMEOUT, f"{s.target}: timeout (last seen: "
                                       "NOT_SERVING: state PENDING)")


def test_wait_is_2_when_nothing_listens() -> None:
    code, _, _ = cli("--target", "127.0.0.1:1", "wait", "--timeout", "0.5")
    assert code == EXIT_TIMEOUT


def test_server_errors_print_field_violations_and_exit_3() -> None:
    with ServerThread() as s:
        code, out, err = cli("--target", s.target, "mixed", "--num-tokens", "-1")
        assert code == EXIT_RPC_ERROR and out == ""
        assert "INVALID_ARGUMENT" in err and "field num_tokens: must be >= 0" in err
        code, out, _ = cli("--target", s.target, "mixed", "--num-tokens", "2")
        assert code == EXIT_OK and "NUM_TOKENS_LT_3" in out


def test_watch_prints_plain_lines_off_a_tty() -> None:
    with ServerThread(server_config("--warmup-on-start")) as s:
        code, out, _ = cli("--target", s.target, "watch")
        assert code == EXIT_OK
        lines = out.strip().splitlines()
        assert lines[-1].startswith("state=READY")
        code, out, _ = cli("--target", s.target, "--json", "watch")
        assert json.loads(out.strip().splitlines()[-1])["state"] == "WARMUP_STATE_READY"


def test_client_cli_runs_without_torch() -> None:
    # Poison torch (and the server package) before anything imports them: importing either
    # raises. Then show help and make a real call (to a port nothing listens on).
    script = ("import sys; sys.modules['torch'] = None; sys.modules['warmgate.server'] = None\n"
              "from warmgate.client.cli import main\n"
              "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
              "sys.exit(main(['--target', '127.0.0.1:1', 'wait', '--timeout', '0.2']))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "client")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, check=False, cwd=ROOT / "client")
    assert proc.returncode == EXIT_TIMEOUT, proc.stderr
    assert "wait" in proc.stdout and "exit codes" in proc.stdout
    assert "127.0.0.1:1: timeout (last seen: UNAVAILABLE" in proc.stdout
