"""Each smoke run's device memory, measured: the smoke packs servers onto the card by
estimates (bench/lib/smoke_plan.py's memory_bytes, --overhead-gib a server), and the peaks
say what those estimates should be.

About once a second the coordinator asks nvidia-smi which processes hold device memory and
sums them per run: a run is a session of its own (its client, server, engine and health
processes), so a process counts for the run whose session id is its own. Without nvidia-smi,
or off the GPU, nothing is sampled and the rows' peak column says "-".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence

from smoke_plan import SmokeRow, memory_bytes, weights_and_kv_bytes

QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
INTERVAL_S = 1.0
MIB, GIB = 2**20, 2**30


def parse_compute_apps(text: str) -> dict[int, int]:
    """Bytes per pid from QUERY's output (`PID, MIB` lines); a pid on several GPUs summed, a
    line without a figure (`[N/A]`, as some drivers print) skipped."""
    held: dict[int, int] = {}
    for line in text.splitlines():
        pid, _, used = (part.strip() for part in line.partition(","))
        if pid.isdigit() and used.isdigit():
            held[int(pid)] = held.get(int(pid), 0) + int(used) * MIB
    return held


def session_of(pid: int) -> int | None:
    """The session id of a process, or None when it has ended (or is not ours to see)."""
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _query() -> str | None:
    try:
        return subprocess.run(QUERY, capture_output=True, text=True, timeout=5,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None  # a sample missed, not a failed smoke


class MemorySampler:
    """The peak device memory of each session, sampled every INTERVAL_S at most."""

    def __init__(self, enabled: bool, query: Callable[[], str | None] = _query,
                 session: Callable[[int], int | None] = session_of,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self._query, self._session, self._clock = query, session, clock
        self._last = -INTERVAL_S
        self._peaks: dict[int, int] = {}

    def sample(self, sessions: Iterable[int]) -> None:
        """Read what each of these sessions holds now, if a sample is due."""
        if not self.enabled or self._clock() - self._last < INTERVAL_S:
            return
        self._last = self._clock()
        text = self._query()
        if text is None:
            return
        wanted = set(sessions)
        held: dict[int, int] = {}
        for pid, used in parse_compute_apps(text).items():
            sid = self._session(pid)
            if sid in wanted:
                held[sid] = held.get(sid, 0) + used
        for sid, used in held.items():
            self._peaks[sid] = max(used, self._peaks.get(sid, 0))

    def peak(self, sid: int) -> int | None:
        """The most the session held in any sample; None when no sample found it."""
        return self._peaks.get(sid)


def sampler_for(device: str) -> MemorySampler:
    return MemorySampler(device.startswith("cuda") and shutil.which(QUERY[0]) is not None)


def summary(rows: Sequence[SmokeRow]) -> str:
    """One line: the largest peak/estimate ratio, and the most a server held beyond its
    weights and KV cache (what --overhead-gib stands for), each with its configuration."""
    measured = [(r.peak_bytes, r.config) for r in rows if r.peak_bytes is not None]
    if not measured:
        return "device memory: not measured (no nvidia-smi, or not on a GPU)"
    ratio, by_ratio = max(((p / memory_bytes(c), c) for p, c in measured), key=lambda t: t[0])
    extra, by_extra = max(((p - weights_and_kv_bytes(c), c) for p, c in measured),
                           key=lambda t: t[0])
    return (f"device memory, {len(measured)} runs measured: peak/estimate at most {ratio:.2f} "
            f"({by_ratio.name}); beyond weights and KV cache at most {extra / GIB:.1f} GiB "
            f"({by_extra.name}), --overhead-gib is {by_extra.overhead_bytes / GIB:.1f}")
