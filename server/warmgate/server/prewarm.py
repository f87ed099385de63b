"""`warmgate-server --warmup-only`: load, warm, fill the cache, print the report, exit.

For a Kubernetes Job or an image build: no gRPC port, health or metrics server is started.
The report goes to stdout (with --json the same JSON `warmgate --json warmup` prints: the
WarmupReport message in protobuf's JSON mapping; else the phase table); logs go to stderr.
Exit 0 when the warmup succeeded, 1 when it (or the load) failed, 70 on a fatal device error.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from warmgate.server.app import local_engine
from warmgate.server.config.server_config import ServerConfig
from warmgate.server.core.failures import FatalDeviceError
from warmgate.server.core.phases import LOAD
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.progress_log import ProgressLog, plan_names
from warmgate.server.core.results import (
    PhaseStatus,
    WarmupOutcome,
    WarmupReport,
)

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_FATAL = 0, 1, 70


def _print(report: WarmupReport, config: ServerConfig, out: TextIO) -> None:
    if config.json_output:
        from warmgate.client.render import to_json
        from warmgate.server.api.convert import report_to_proto

        print(to_json(report_to_proto(report)), file=out, flush=True)
        return
    from warmgate.server.warmup.table import format_phase_table

    print(format_phase_table(report), file=out, flush=True)


def run_warmup_only(config: ServerConfig, *, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    # In this process even with --engine-process: that flag keeps the step loop off the gRPC
    # server's GIL, and a warmup-only run has no gRPC server.
    engine = local_engine(config)
    start = time.perf_counter()
    # A line every few seconds while a phase runs long: a Job's log has no WatchStatus.
    progress = ProgressLog(plan_names(config.runner.parallel.tensor_parallel_size)).start()
    try:
        progress.begin(LOAD)
        load = engine.load()
        progress(ProgressEvent(LOAD, 1, 1))
        if load.status is PhaseStatus.FAILED:
            device = config.runner.device  # resolved at start-up: names what failed to load
            report = WarmupReport(WarmupOutcome.FAILED, [load], time.perf_counter() - start,
                                  config.runner.config_hash(), model=config.runner.model.name,
                                  device=device.device,
                                  attention_backend=device.attention_backend)
            report.compile_cache = engine.compile_cache_info()
        else:  # no heap freeze after it (control/heap_freeze.py): nothing is served after
            report = engine.run_plan(mixed_num_tokens=config.mixed_num_tokens, force=False,
                                     progress=progress)
    except FatalDeviceError as exc:
        logger.critical("fatal device error during %s: %s", exc.phase, exc.cause)
        return EXIT_FATAL
    finally:
        progress.stop()
        monitor = getattr(engine, "jit_monitor", None)  # its compiler hooks are process-wide
        if monitor is not None:
            monitor.close()
    _print(report, config, out)
    logger.info("warmup-only: %s in %.3f s (compile cache %s)", report.outcome.value,
                report.total_duration_s, (report.compile_cache or {}).get("state", "off"))
    return EXIT_OK if report.succeeded else EXIT_FAILED
