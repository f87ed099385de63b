"""`warmgate report --plot`: the phase timeline from both JSON forms, and the command's paths."""

from __future__ import annotations

import argparse
import io
import json
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from warmgate.client import render
from warmgate.client.exit_codes import EXIT_LOCAL
from warmgate.client.report_cmd import add_report_command, run_report
from warmgate.client.report_plot import ReportError, figure_size_px, timeline, total_seconds
from warmgate.v1 import warmup_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
PlotFn = Callable[[dict[str, Any], str], None]

SERVER_FORM: dict[str, Any] = {
    "outcome": "SUCCEEDED", "total_duration_s": 4.5, "model": "tiny", "device": "cpu",
    "attention_backend": "torch", "config_hash": "abc",
    "phases": [
        {"name": "load", "status": "RAN", "duration_s": 1.5, "skip_reason": None, "detail": ""},
        {"name": "flashinfer", "status": "SKIPPED", "duration_s": 0.0,
         "skip_reason": "BACKEND_NOT_SELECTED", "detail": "attention backend is torch"},
        {"name": "kernels.prefill", "status": "RAN", "duration_s": 2.0, "skip_reason": None},
        {"name": "mixed", "status": "FAILED", "duration_s": 1.0, "skip_reason": None,
         "detail": "RuntimeError: out of KV blocks; lower --max-num-seqs"},
    ],
}


def proto_report() -> pb.WarmupReport:
    report = pb.WarmupReport(outcome=pb.WARMUP_OUTCOME_SUCCEEDED, model="llama-3.2-1b",
                             device="cuda:0", attention_backend="flashinfer")
    report.total_duration.FromMilliseconds(111_250)
    for name, status, ms, reason in (
            ("load", pb.PHASE_STATUS_RAN, 6_000, pb.SKIP_REASON_UNSPECIFIED),
            ("flashinfer", pb.PHASE_STATUS_RAN, 104_000, pb.SKIP_REASON_UNSPECIFIED),
            ("mixed", pb.PHASE_STATUS_SKIPPED, 0, pb.SKIP_REASON_MAX_NUM_REQS_LT_2),
            ("cuda_graphs", pb.PHASE_STATUS_RAN, 1_250, pb.SKIP_REASON_UNSPECIFIED)):
        phase = report.phases.add(name=name, status=status, skip_reason=reason)
        phase.duration.FromMilliseconds(ms)
    return report


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# -- the timeline (no matplotlib needed) ---------------------------------------------------

def test_phases_are_laid_end_to_end_by_cumulative_duration() -> None:
    phases = timeline(SERVER_FORM)
    assert [(p.name, p.status, p.start_s, p.duration_s) for p in phases] == [
        ("load", "RAN", 0.0, 1.5), ("flashinfer", "SKIPPED", 1.5, 0.0),
        ("kernels.prefill", "RAN", 1.5, 2.0), ("mixed", "FAILED", 3.5, 1.0)]
    assert phases[1].skip_reason == "BACKEND_NOT_SELECTED"
    assert phases[0].skip_reason is None
    assert total_seconds(SERVER_FORM) == 4.5


@pytest.mark.parametrize("field_names", ["proto", "camel"])
def test_protobuf_json_durations_and_enum_prefixes(field_names: str) -> None:
    message = proto_report()
    data = (render.to_dict(message) if field_names == "proto"
            else json_format.MessageToDict(message))
    assert data["phases"][0]["duration"] == "6s"  # what both forms look like
    phases = timeline(data)
    assert [p.status for p in phases] == ["RAN", "RAN", "SKIPPED", "RAN"]
    assert [p.start_s for p in phases] == [0.0, 6.0, 110.0, 110.0]
    assert phases[2].skip_reason == "MAX_NUM_REQS_LT_2"
    assert phases[1].skip_reason is None  # SKIP_REASON_UNSPECIFIED
    assert total_seconds(data) == pytest.approx(111.25)


def test_a_status_is_unwrapped_to_its_last_report() -> None:
    status = pb.WarmupStatus(state=pb.WARMUP_STATE_READY)
    status.last_report.CopyFrom(proto_report())
    assert len(timeline(render.to_dict(status))) == 4


@pytest.mark.parametrize("bad", [{"state": "READY"}, [], {"phases": [{"status": "WEIRD"}]},
                                 {"phases": [{"status": "RAN", "duration": "soon"}]}])
def test_bad_input_is_a_report_error(bad: Any) -> None:
    with pytest.raises(ReportError):
        timeline(bad)


def test_the_client_does_not_import_matplotlib() -> None:
    code = ("import sys, warmgate.client.report_plot, warmgate.client.report_cmd, "
            "warmgate.client.cli; assert 'matplotlib' not in sys.modules, 'eager import'")
    env_path = f"{ROOT / 'client'}:{ROOT / 'server'}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": env_path}, check=False)
    assert proc.returncode == 0, proc.stderr


# -- the PNG ---------------------------------------------------------------------------------

@pytest.fixture
def plot_report() -> PlotFn:
    pytest.importorskip("matplotlib", reason="plotting needs the plot extra (matplotlib)")
    from warmgate.client.report_plot import plot_report

    return plot_report


@pytest.mark.parametrize("form", ["server", "proto"])
def test_plot_writes_a_png_of_the_documented_size(plot_report: PlotFn, tmp_path: Path,
                                                  form: str) -> None:
    report = SERVER_FORM if form == "server" else render.to_dict(proto_report())
    out = tmp_path / "timeline.png"
    plot_report(report, str(out))
    assert out.stat().st_size > 10_000  # bars, labels and text, not an empty canvas
    assert png_size(out) == figure_size_px(len(report["phases"]))


def test_plot_of_a_real_tiny_warmup(plot_report: PlotFn, tmp_path: Path) -> None:
    from warmgate.server.config.runner_config import ModelConfig, RunnerConfig
    from warmgate.server.warmup.plan import load_runner, run_warmup_plan

    runner, load_phase = load_runner(RunnerConfig(model=ModelConfig.from_preset("tiny")))
    report = run_warmup_plan(runner, load_phase=load_phase).to_dict()
    out = tmp_path / "tiny.png"
    plot_report(json.loads(json.dumps(report)), str(out))
    assert png_size(out) == figure_size_px(len(report["phases"]))


# -- the command -----------------------------------------------------------------------------

def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warmgate")
    parser.add_argument("--target", default="localhost:50051")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rpc-timeout", type=float, default=None)
    add_report_command(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


class FakeClient:
    def __init__(self, status: pb.WarmupStatus) -> None:
        self.status = status
        self.timeouts: list[float | None] = []

    def get_status(self, *, timeout: float | None = None) -> pb.WarmupStatus:
        self.timeouts.append(timeout)
        return self.status


def no_client() -> FakeClient:
    raise AssertionError("--input must not contact a server")


def test_report_from_a_file(plot_report: PlotFn, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "report.json"
    src.write_text(json.dumps(SERVER_FORM))
    out = tmp_path / "out.png"
    args = parse(["--json", "report", "--input", str(src), "--plot", str(out)])
    assert run_report(args, no_client) == 0
    assert json.loads(capsys.readouterr().out) == {"plot": str(out), "phases": 4,
                                                   "total_s": 4.5}
    assert png_size(out) == figure_size_px(4)


def test_report_from_the_live_server(plot_report: PlotFn, tmp_path: Path) -> None:
    status = pb.WarmupStatus(state=pb.WARMUP_STATE_READY)
    status.last_report.CopyFrom(proto_report())
    client = FakeClient(status)
    out = tmp_path / "live.png"
    assert run_report(parse(["--rpc-timeout", "3", "report", "--plot", str(out)]),
                      lambda: client) == 0
    assert client.timeouts == [3.0]
    assert png_size(out) == figure_size_px(4)


def test_no_finished_warmup_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeClient(pb.WarmupStatus(state=pb.WARMUP_STATE_RUNNING))
    out = tmp_path / "none.png"
    assert run_report(parse(["report", "--plot", str(out)]), lambda: client) == EXIT_LOCAL
    assert "no warmup has finished yet" in capsys.readouterr().err
    assert not out.exists()


def test_unreadable_input_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "broken.json"
    src.write_text("{not json")
    args = parse(["report", "--input", str(src), "--plot", str(tmp_path / "x.png")])
    assert run_report(args, no_client) == EXIT_LOCAL
    assert "broken.json" in capsys.readouterr().err
    missing = parse(["report", "--input", str(tmp_path / "nope.json"), "--plot", "x.png"])
    assert run_report(missing, no_client) == EXIT_LOCAL


def test_cli_report_against_a_real_server(plot_report: PlotFn, tmp_path: Path) -> None:
    from tests.grpc_harness import ServerThread, server_config
    from warmgate.client import cli
    from warmgate.client.api import WaitResult, WarmgateClient
    from warmgate.server.core.phases import PLAN_PHASES

    out = tmp_path / "live.png"
    with ServerThread(server_config("--warmup-on-start")) as server:
        with WarmgateClient(server.target, timeout=10) as client:
            assert client.wait_ready(60.0) is WaitResult.READY
        text = io.StringIO()
        assert cli.main(["--target", server.target, "report", "--plot", str(out)],
                        out=text) == 0
    assert text.getvalue().startswith(f"wrote {out}: {len(PLAN_PHASES)} phases")
    assert png_size(out) == figure_size_px(len(PLAN_PHASES))
