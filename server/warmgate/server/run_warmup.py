"""`python -m warmgate.server.run_warmup`: run the whole plan and print the phase table.

A program at the top of the house, beside main.py and prewarm.py: it reads the server's flags
(startup.py) and prints the API's JSON report (api/convert.py), both above warmup/.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Mapping

from warmgate.server.config.runner_config import ConfigError, RunnerConfig
from warmgate.server.config.server_config import RUNNER_FLAGS, add_options, report_config_error
from warmgate.server.core.phases import LOAD
from warmgate.server.core.progress import ProgressEvent
from warmgate.server.core.progress_log import ProgressLog, plan_names
from warmgate.server.jit import JitMonitor
from warmgate.server.startup import checked_runner_config
from warmgate.server.warmup.plan import load_runner, run_warmup_plan
from warmgate.server.warmup.shapes import check_config_capacity
from warmgate.server.warmup.table import format_phase_table


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m warmgate.server.run_warmup",
                                description="Warm every kernel path of a model runner once and "
                                            "print how long each phase took (the server's "
                                            "runner flags and environment variables).")
    add_options(p, (*RUNNER_FLAGS, "--mixed-num-tokens", "--json"), environ)
    p.add_argument("--pooling", action="store_true", help="run the pooling (embedding) variant")
    return p


def build_config(args: argparse.Namespace) -> RunnerConfig:
    config = checked_runner_config(args)
    if not args.pooling:
        return config
    return dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                 is_pooling_model=True))


def main(argv: list[str] | None = None) -> int:
    parser = _parser(os.environ)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args)
        check_config_capacity(config, args.mixed_num_tokens)
    except ConfigError as exc:
        report_config_error(parser, exc)  # exits 2, naming the flag
    monitor = JitMonitor()  # so the table's phases carry their compile counts
    # A line every few seconds while a phase runs long (two minutes of sampler on a CPU).
    with ProgressLog(plan_names(config.parallel.tensor_parallel_size)) as progress:
        progress.begin(LOAD)
        runner, load_phase = load_runner(config, jit_monitor=monitor)
        progress(ProgressEvent(LOAD, 1, 1))
        report = run_warmup_plan(runner, load_phase=load_phase,
                                 mixed_num_tokens=args.mixed_num_tokens, progress=progress)
    if args.json:  # the schema `warmgate --json warmup` and `--warmup-only --json` print
        from warmgate.client.render import to_json
        from warmgate.server.api.convert import report_to_proto

        print(to_json(report_to_proto(report)))
    else:
        print(format_phase_table(report))
    return 0 if report.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
