"""bench/serve.py frontend-cost's reading of /proc and its per-message figures, against a /proc
tree written here (a process name with spaces and parentheses, a thread whose children file
is gone) and this test process's own entry."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.bench_harness import load_script
from warmgate.server.devtools.load_stats import RequestResult

bench = load_script("bench/lib/frontend_cost.py")
TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int, name: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    return f"{pid} ({name}) S 1 1 1 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 9 0\n"


def test_cpu_seconds_are_user_plus_system_whatever_the_name(tmp_path: Path) -> None:
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "stat").write_text(_stat(41, "python (front) 2", 3 * TICK, TICK))
    assert bench.process_cpu_s(41, tmp_path) == 4.0


def test_children_of_every_thread(tmp_path: Path) -> None:
    tasks = tmp_path / "41" / "task"
    for tid, children in (("41", "57 58 "), ("42", ""), ("43", None)):
        (tasks / tid).mkdir(parents=True)
        if children is not None:  # thread 43 ended: no children file
            (tasks / tid / "children").write_text(children)
    (tasks / "44").mkdir()
    (tasks / "44" / "children").write_text("60\n")
    assert bench.child_pids(41, tmp_path) == [57, 58, 60]


def test_this_process_cpu_time_moves_as_it_computes() -> None:
    before = bench.process_cpu_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert bench.process_cpu_s(os.getpid()) - before >= 0.02


def test_a_row_per_message_and_a_core_share() -> None:
    results = [RequestResult(0, 0.0, messages=[(0.1, 1), (0.2, 3)]),
               RequestResult(1, 0.0, messages=[(0.1, 2)])]
    row = bench.CostRow.of(2, results, wall_s=0.5, front_cpu_s=0.3, engine_cpu_s=0.4,
                           client_cpu_s=0.15)
    assert (row.tokens, row.messages) == (6, 3)
    cells = [c.strip() for c in row.cells()]
    # 6 tokens in 3 messages; 12 tok/s; the front 0.3 s over 3 messages and 0.6 of a core.
    assert cells == ["2", "6", "3", "2.00", "12", "100000.0", "0.60", "0.80", "50000.0",
                     "0.30"]
    lines = bench.format_rows([row])
    assert len(lines) == 3 and lines[0].split()[0] == "streams"
    assert len({len(line) for line in lines}) == 1  # the columns line up


def test_the_arms_summary_is_each_arms_median_against_the_first() -> None:
    def row(tokens: int, wall_s: float, front_cpu_s: float) -> object:
        return bench.CostRow(128, tokens, tokens, wall_s, front_cpu_s, 1.0, 1.0)

    base = [row(1000, 1.0, 0.06), row(1000, 2.0, 0.05), row(1000, 1.25, 0.07)]
    fewer = [row(1000, 1.0, 0.03), row(1000, 1.0, 0.02), row(1000, 0.5, 0.04)]
    lines = bench.arms_summary(["--stream-interval 1", "--stream-interval 4"], [base, fewer])
    # Medians: 60 us/token and 800 tok/s, then 30 us/token and 1000 tok/s.
    assert lines[0] == ("arm --stream-interval 1: front 60.0 us/token (1.00x), 800 tok/s "
                        "(1.00x), median of 3 rounds")
    assert lines[1] == ("arm --stream-interval 4: front 30.0 us/token (0.50x), 1000 tok/s "
                        "(1.25x), median of 3 rounds")
