"""Build a runner in this process and warm it the way the server does (shared by the
coverage workload and the first-batch benchmark)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from warmgate.server.config import (
    CacheConfig,
    CompilationConfig,
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from warmgate.server.jit import JitMonitor
from warmgate.server.presets import preset_names
from warmgate.server.warmup.plan import load_runner, run_warmup_plan
from warmgate.server.warmup.results import PhaseResult, WarmupReport


def add_runner_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help=f"preset ({', '.join(preset_names())})")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attention-backend", default="auto", help="torch, triton or flashinfer")
    p.add_argument("--compile", action="store_true", help="torch.compile the dense layers")
    p.add_argument("--num-speculative-steps", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-shape-sweeps", dest="shape_sweeps", action="store_false",
                   help="skip the compile phase's dense GEMM sweep (CUDA)")


def runner_config(args: argparse.Namespace, **overrides: Any) -> RunnerConfig:
    """The runner the flags describe; `overrides` replace flag values (e.g. num_spec)."""
    opts = {**vars(args), **overrides}
    model = {} if opts["max_model_len"] is None else {"max_model_len": opts["max_model_len"]}
    return RunnerConfig(
        model=ModelConfig.from_preset(opts["model"], **model),
        cache=CacheConfig(block_size=opts["block_size"], num_blocks=opts["num_blocks"]),
        scheduler=SchedulerConfig(max_num_seqs=opts["max_num_seqs"],
                                  max_num_batched_tokens=opts["max_num_batched_tokens"]),
        speculative=SpeculativeConfig(num_speculative_steps=opts["num_speculative_steps"]),
        device=DeviceConfig(device=opts["device"], dtype=opts["dtype"],
                            attention_backend=opts["attention_backend"]),
        compilation=CompilationConfig(compile=opts["compile"],
                                      shape_sweeps=opts["shape_sweeps"]))


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


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
