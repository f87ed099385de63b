#!/usr/bin/env python3
"""Is it warm? Once health says SERVING, does anything still compile or miss a CUDA graph,
and is the first request of each kind as fast as the steady ones (and if not, where does the
extra time go)?"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
from toolbox import Command, run

COMMANDS = {
    "coverage": Command("coverage.py", "random batches after ready: compiles_after_ready and "
                                       "CUDA-graph misses (the goal is 0)"),
    "first-request": Command("first_request.py", "--mode batch|probe|touch|profile|ttft|"
                                                 "breakdown|options|...: first after ready / "
                                                 "steady median, and where the extra goes"),
    "served": Command("served_coverage.py", "random Generate requests with every sampling "
                                            "option against a real server: compiles, autotunes "
                                            "and graph misses after ready, first/steady TTFT"),
    "smoke": Command("smoke.py", "every preset x backend x k on fresh servers: one row each "
                                 "(ready s, first/steady TTFT, compiles, autotunes, misses, "
                                 "errors after ready)"),
    "gc-after-warmup": Command("gc_after_warmup.py", "the collector's pauses in the first "
                                                     "serving steps after a warmup, with the "
                                                     "heap freeze before ready vs without"),
    "kernel-map-touch": Command("kernel_map_touch.py", "the first GEMM at a token count the "
                                                       "warmup skipped against the same again"),
}

if __name__ == "__main__":
    sys.exit(run("bench/warm.py", __doc__, COMMANDS, sys.argv[1:]))
