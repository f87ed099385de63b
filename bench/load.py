#!/usr/bin/env python3
"""Does it hold under load? Health probes answered in time while kernels warm up, and
thousands of concurrent calls during warmups and a soak without errors or memory growth."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
from toolbox import Command, run

COMMANDS = {
    "health-latency": Command("health_latency.py", "Health.Check p50/p99 idle vs during "
                                                   "warmups; --burst N: N simultaneous checks"),
    "soak": Command("load_soak.py", "concurrent GetStatus and Health.Check during forced "
                                    "warmups, then a soak: errors, p50/p99/max, RSS"),
}

if __name__ == "__main__":
    sys.exit(run("bench/load.py", __doc__, COMMANDS, sys.argv[1:]))
