"""The smoke test's quiet TTFT: one ready server at a time times its first and steady TTFT
while every other run of the smoke is stopped.

Servers side by side share the GPU, and a first request timed beside another server's warmup
or load looks slow for reasons of its own (on an H100, first/steady up to 1.45 with the others
only serving). Waiting for the others to go idle serialised the matrix instead: a ready server
held every start back until all warmups ended. So the coordinator stops every process of
every other run's session (SIGSTOP: its client, server, engine and health processes alike;
SessionPause), lets the GPU drain the work they had queued, has the ready one time its TTFT,
and continues them (SIGCONT).
The FlashInfer JIT prebuilds are stopped the same way: their nvcc jobs take every CPU core for
minutes, and on an H100 eight of the fourteen rows timed while they built had a first TTFT
1.21-2.01x the steady one, while all eight rows timed after them were within 1.13.

A stop is bounded by MAX_PAUSE_S: a server's health process ends it when its heartbeats stop
for 10 s (core/health_wire.py), and both resume together, so a stop shorter than that loses
nothing. A TTFT still being timed then goes on beside the others, and the row says so.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

MAX_PAUSE_S = 8.0
# A stopped process launches nothing more, but its kernels already queued run on: the
# longest a warmup queues (an autotune's timed launches, a graph replay) end well within this.
SETTLE_S = 0.3


class Stoppable(Protocol):
    """Anything the quiet window stops while a TTFT is timed (a run, a JIT prebuild)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class Pausable(Stoppable, Protocol):
    """A run as the quiet window sees it (smoke.Run)."""

    started: float
    note: str

    @property
    def waiting(self) -> bool: ...

    @property
    def timing(self) -> bool: ...

    def go(self) -> None: ...


class SessionPause:
    """Stops and continues every process of one session, counting the seconds it spent
    stopped.

    A session, not a process group: ninja, which FlashInfer's JIT builds with, starts each
    compile in a process group of its own, so a stop sent to the prebuild's group reached the
    prebuild and ninja but not the nvcc jobs already running, and those went on taking every
    core while a TTFT was timed (an H100's small presets: the torch backend's rows timed during
    the prebuilds took 77-109 ms at the server where the same server alone took 34-38). A
    process keeps its session whatever group it moves to."""

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.paused_s = 0.0
        self._since: float | None = None

    def pause(self) -> None:
        if self._since is None and self._stop_all():
            self._since = time.monotonic()

    def resume(self) -> None:
        if self._since is not None:
            signal_session(self.sid, signal.SIGCONT)
            self.paused_s += time.monotonic() - self._since
            self._since = None

    def stopped_s(self) -> float:
        """Seconds stopped so far, the current stop included."""
        current = 0.0 if self._since is None else time.monotonic() - self._since
        return self.paused_s + current

    def _stop_all(self) -> bool:
        """Stop every member; again for any a member started before its own stop landed,
        until a scan finds none new. False when the session has no process left."""
        stopped: set[int] = set()
        for _ in range(_STOP_SCANS):
            new = [pid for pid in session_members(self.sid) if pid not in stopped]
            if not new:
                break
            stopped.update(pid for pid in new if _signal(pid, signal.SIGSTOP))
        return bool(stopped)


# Scans of a session for members its stopped processes started just before their stop.
_STOP_SCANS = 4


def session_members(sid: int) -> list[int]:
    """The pids whose session is `sid` (Linux /proc: stat's sixth field)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        # After the command name's closing parenthesis: state, ppid, pgrp, session, ...
        if int(stat.rsplit(")", 1)[1].split()[3]) == sid:
            members.append(int(entry))
    return members


def signal_session(sid: int, sig: signal.Signals) -> int:
    """Send `sig` to every process of session `sid`; how many it reached."""
    return sum(_signal(pid, sig) for pid in session_members(sid))


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it ended meanwhile
        return False
    return True


class QuietWindow:
    """Who times its TTFT now, and whom that stopped."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.timer: Pausable | None = None
        self._stopped: list[Stoppable] = []
        self._since = 0.0
        self._clock = clock
        self._sleep = sleep

    @property
    def open(self) -> bool:
        """Whether a server is timing its TTFT (no run may start meanwhile)."""
        return self.timer is not None

    def step(self, running: Sequence[Pausable], bystanders: Sequence[Stoppable] = ()) -> None:
        """Close the window once its TTFT is measured (or its run ended, or the stop's
        bound passed), then open one for the server that has waited longest, stopping every
        other run and every bystander (work that never times a TTFT: the JIT prebuilds)."""
        if self.timer is not None:
            ended = self.timer not in running or not self.timer.timing
            if not ended and self._clock() - self._since < MAX_PAUSE_S:
                return
            if not ended:
                self.timer.note = (f"TTFT timed partly beside other servers: not measured "
                                   f"within the {MAX_PAUSE_S:.0f} s they may stay stopped")
            self.close()
        waiting = [r for r in running if r.waiting]
        if not waiting:
            return
        self.timer = min(waiting, key=lambda r: r.started)
        self._stopped = [*(r for r in running if r is not self.timer), *bystanders]
        for run in self._stopped:
            run.pause()
        if self._stopped:
            self._sleep(SETTLE_S)
        self._since = self._clock()
        self.timer.go()

    def close(self) -> None:
        """Continue every run the window stopped (also when the smoke itself ends)."""
        for run in self._stopped:
            run.resume()
        self._stopped = []
        self.timer = None
