"""One configuration of the smoke as it runs: its `bench/warm.py served` process, the files
through which it says how far it got (served's --ttft-gate), and its row once it ended."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from smoke_plan import SmokeConfig, SmokeRow, read_served
from smoke_quiet import SessionPause, signal_session

WARM = str(Path(__file__).resolve().parents[1] / "warm.py")
TERM_GRACE_S = 10.0  # after SIGTERM, the seconds a run that timed out has to write its log


def log_stem(config: SmokeConfig) -> str:
    return config.name.replace(":", "-")


class Run:
    """One configuration's `bench/warm.py served` in a session of its own (its server is in
    it too, so a timeout stops both, and its session id finds its processes' device memory).
    Its output goes to <logs>/<stem>.txt, its server's whole log to <stem>.server.txt."""

    def __init__(self, config: SmokeConfig, device: str, args: argparse.Namespace,
                 logs: Path) -> None:
        self.row = SmokeRow(config, ttft_limit=args.ttft_limit)
        self.started = time.monotonic()
        stem = log_stem(config)
        self.log = logs / (stem + ".txt")
        self.gate = str(logs / stem)  # served's --ttft-gate files
        self.note = ""  # what the quiet window says of its TTFT, if anything
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, WARM, "served", "--requests", str(args.requests), "--repeats", "5",
             "--gap-s", "0.3", "--ttft-gate", self.gate,
             "--server-log", str(logs / (stem + ".server.txt")),
             "--server-args", config.server_args(device)],
            stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        self._pause = SessionPause(self.proc.pid)  # start_new_session: sid == pid

    @property
    def session(self) -> int:
        return self.proc.pid  # start_new_session: the session id is the leader's pid

    def pause(self) -> None:
        self._pause.pause()

    def resume(self) -> None:
        self._pause.resume()

    @property
    def paused_s(self) -> float:
        return self._pause.stopped_s()

    def _has(self, suffix: str) -> bool:
        return os.path.exists(self.gate + suffix)

    @property
    def warming(self) -> bool:
        return not self._has(".ready")

    @property
    def waiting(self) -> bool:
        return self._has(".ready") and not self._has(".go")

    @property
    def timing(self) -> bool:
        return self._has(".go") and not self._has(".measured")

    def go(self) -> None:
        Path(self.gate + ".go").touch()

    def _stop(self) -> None:
        """SIGTERM, so served writes its server's log; SIGKILL if it lingers."""
        for sig in (signal.SIGTERM, signal.SIGCONT):  # a stopped process gets the TERM on CONT
            signal_session(self.proc.pid, sig)
        try:
            self.proc.wait(TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            signal_session(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def poll(self, timeout_s: float, cut: str | None = None) -> bool:
        """Whether the run has ended (stopped now if past its time, the seconds others' TTFT
        kept it stopped not counted, or if `cut` says why the smoke stops it now)."""
        if self.proc.poll() is None:
            if cut is None and time.monotonic() - self.started - self.paused_s < timeout_s:
                return False
            self._stop()
            self.row.note = cut or f"timed out after {timeout_s:.0f} s"
        self._out.close()
        self.row.wall_s = time.monotonic() - self.started
        self.row.exit_code = self.proc.returncode
        output = self.log.read_text(errors="replace")
        read_served(self.row, output)
        if not self.row.clean and not self.row.note:
            self.row.note = "; ".join([*self.row.faults(), *filter(None, [self.note])])
            if self.row.exit_code:
                lines = [ln for ln in output.splitlines() if ln.strip()]
                self.row.note += f" ({self.log.name}: {lines[-1][:100] if lines else 'no output'})"
        return True
