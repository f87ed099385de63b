#!/usr/bin/env python3
"""How fast does it start? Time from the process's start to health SERVING, warm and cold,
against the floor (CUDA init + a bare weight load), and where the start-up's time goes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
from toolbox import Command, run

COMMANDS = {
    "time-to-ready": Command("time_to_ready.py", "cold and warm time to SERVING, each phase, "
                                                 "and ready_over_floor"),
    "ready-ab": Command("ready_ab.py", "warm time to ready of two source trees, alternated "
                                      "round by round: their ratio"),
    "profile": Command("startup_profile.py", "where a start-up's Python time goes, line by "
                                             "line and thread by thread"),
    "cuda-init-gil": Command("cuda_init_gil.py", "whether creating the CUDA context on a thread "
                                                 "stalls the main thread"),
}

if __name__ == "__main__":
    sys.exit(run("bench/start.py", __doc__, COMMANDS, sys.argv[1:]))
