"""Start-up: the server's configuration from flags and environment, checked end to end
before anything binds.

config/ parses and validates what needs no runner; the checks here add a model directory's
weight files (their headers, config.weight_files) and, from the layers above it, whether the
warmup plan fits the configuration (warmup.shapes). A configuration that can never serve
exits 2 with one line naming the flag, never after the server has said it is starting.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from warmgate.server.config.runner_config import ConfigError, RunnerConfig, resolve_runner_config
from warmgate.server.config.server_config import (
    ServerConfig,
    build_parser,
    check_mixed_num_tokens,
    model_error,
    report_config_error,
    runner_config_from_args,
    server_config_from_args,
)
from warmgate.server.config.startup_checks import (
    check_attention_backend,
    check_host_memory,
    check_moe_kernel,
)
from warmgate.server.distributed.startup_check import check_tensor_parallel
from warmgate.server.host_memory import host_available_bytes


def check_model_files(runner: RunnerConfig) -> None:
    """A model directory's load checks, now: the context against the checkpoint's positions,
    tensor names and shapes from the file headers. ConfigError names the flag."""
    directory = runner.model.weights_path
    if directory is None:
        return
    from warmgate.server.config.weight_files import check_config_matches, index_weight_files

    try:
        check_config_matches(runner.model, directory)
        index_weight_files(directory, runner.model)
    except ConfigError:  # already names its flag
        raise
    except (ValueError, OSError) as exc:
        raise model_error(directory, exc) from None


def checked_runner_config(args: argparse.Namespace) -> RunnerConfig:
    """runner_config_from_args, and a model directory that can never load refused now."""
    runner = runner_config_from_args(args)
    check_model_files(runner)
    return runner


def check_can_warm_up(runner: RunnerConfig, mixed_num_tokens: int | None,
                      environ: Mapping[str, str]) -> None:
    """The resolved backend runs here, and the warmup plan fits: a configuration whose plan
    can never succeed can never serve."""
    # Before the runner (and torch) is imported: an absurd length fails in a small process.
    check_host_memory(runner, host_available_bytes())
    from warmgate.server.warmup.shapes import check_config_capacity  # imports the runner

    check_attention_backend(runner, environ)
    check_moe_kernel(runner)
    check_tensor_parallel(runner)
    check_config_capacity(runner, mixed_num_tokens)


def load_server_config(argv: Sequence[str] | None = None,
                       environ: Mapping[str, str] | None = None, *,
                       resolve: bool = True) -> ServerConfig:
    """Parse flags over environment defaults; exit 2 with a message naming the bad flag.

    `resolve` turns every "auto" into a concrete device, dtype and backend now and runs the
    warmup checks, so an impossible choice (`--device cuda` without CUDA) fails at start-up,
    naming its flag; without it (manifest checks) nothing probes the machine.
    """
    environ = os.environ if environ is None else environ
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    try:
        runner = checked_runner_config(args)
        if resolve:
            runner = resolve_runner_config(runner)
    except ConfigError as exc:
        report_config_error(parser, exc)
    check_mixed_num_tokens(parser, args, runner)
    if resolve:
        try:
            check_can_warm_up(runner, args.mixed_num_tokens, environ)
        except ConfigError as exc:
            report_config_error(parser, exc)
    return server_config_from_args(parser, args, runner, environ)
