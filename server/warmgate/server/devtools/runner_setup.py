"""A runner built in this process from the server's own flags and warmed the way the server
warms it, for tools that time or probe it directly."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.config.server_config import RUNNER_FLAGS, add_options
from warmgate.server.core.results import PhaseResult, WarmupReport
from warmgate.server.jit import JitMonitor
from warmgate.server.startup import checked_runner_config
from warmgate.server.warmup.plan import load_runner, run_warmup_plan


def add_runner_args(p: argparse.ArgumentParser) -> None:
    """The server's runner flags (same names and parsing), on the CPU unless told; the
    WARMGATE_ environment is not read, so a tool runs what its command line says."""
    add_options(p, RUNNER_FLAGS, environ={}, defaults={"--device": "cpu"})


def runner_config(args: argparse.Namespace, **overrides: Any) -> RunnerConfig:
    """The runner the flags describe; `overrides` replace flag values (e.g. num_spec)."""
    return checked_runner_config(argparse.Namespace(**{**vars(args), **overrides}))


def build(config: RunnerConfig) -> tuple[Any, PhaseResult, JitMonitor]:
    """A runner with the compiler hooks its configuration needs installed."""
    monitor = JitMonitor()
    runner, load_phase = load_runner(config, jit_monitor=monitor)
    return runner, load_phase, monitor


def warm(runner: Any, load_phase: PhaseResult, monitor: JitMonitor) -> WarmupReport:
    """The server's plan, then ready: every compile from here on is counted after ready."""
    report = run_warmup_plan(runner, load_phase=load_phase)
    if report.succeeded:
        monitor.mark_ready()
    return report


def build_and_warm(config: RunnerConfig) -> tuple[Any, WarmupReport, JitMonitor]:
    """build() then warm(); exits naming the report when the plan fails."""
    runner, load_phase, monitor = build(config)
    report = warm(runner, load_phase, monitor)
    if not report.succeeded:
        raise SystemExit(f"warmup failed: {report.to_dict()}")
    return runner, report, monitor


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
