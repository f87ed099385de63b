"""The server's configuration: ServerConfig, its flags, and building it from parsed flags.

Each flagged setting declares its flag, help and default once, on its field (config.flags);
the parser, the WARMGATE_ environment names and the error-to-flag map are generated from
them. This module parses and validates what needs no runner: the start-up checks that build
part of one (model files, the warmup plan's capacity) are warmgate.server.startup's, which
assembles the whole start-up from these pieces. Nothing is read at import time: the caller
hands in argv and environ, so tests never touch the real environment.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from warmgate.server.config import flag_values
from warmgate.server.config.faults import ENV_VAR as FAULT_ENV_VAR
from warmgate.server.config.faults import Fault, parse_faults
from warmgate.server.config.flags import (
    ENV_PREFIX,
    PROG,
    OneLineParser,
    Option,
    build,
    flag,
    flag_for,
    options_of,
    values_by_path,
)
from warmgate.server.config.flags import add_options as _add_options
from warmgate.server.config.hf_config import ModelLoadError, model_config_from_hf
from warmgate.server.config.model_files import ModelFileError, check_inside_model_dir
from warmgate.server.config.presets import MODEL_PRESETS, preset_names
from warmgate.server.config.runner_config import ConfigError, ModelConfig, RunnerConfig
from warmgate.server.config.security import (
    SecurityConfigError,
    ServerSecurity,
    load_server_security,
)
from warmgate.server.config.serving_config import ServingConfig

# Waiting on another process filling the cache entry, plus a cold warmup of its own when the
# wait times out, must fit the GPU startupProbe's budget (deploy/components/gpu): past it the
# kubelet kills the pod and it queues again. .ci/check_manifests.py checks the fit.
CACHE_LOCK_TIMEOUT_S = 240.0
METRICS_DISABLED = HEALTH_PORT_DISABLED = flag_values.PORT_DISABLED
# grpc.health.v1 Watch streams open at once, on each port that serves health. Clients that
# check health on their side (a gRPC channel's health-checking load balancing) hold one per
# channel, so the cap is for a fleet of them, not for a few tools as WatchStatus's is; each
# stream holds about 18 KiB of the serving process (10,000 unbounded ones: 182 MiB).
MAX_HEALTH_WATCHERS = 1024
# The metrics port: a scraper or two, each with one connection per scrape; an idle one is
# closed after this long (Prometheus sends its request at once, and its default scrape
# timeout is 10 s).
METRICS_MAX_CONNECTIONS = 16
METRICS_IDLE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServerConfig:
    runner: RunnerConfig
    host: str = field(default="0.0.0.0", metadata=flag(
        "--host", "address the gRPC and metrics servers bind"))
    port: int = field(default=50051, metadata=flag(
        "--port", "gRPC port; 0 picks a free one", parse=flag_values.port))
    metrics_port: int = field(default=9464, metadata=flag(
        "--metrics-port", "Prometheus port; 0 picks a free one, -1 disables the endpoint",
        parse=flag_values.optional_port))
    metrics_max_connections: int = field(default=METRICS_MAX_CONNECTIONS, metadata=flag(
        "--metrics-max-connections", "connections the metrics port serves at once (a thread "
        "each); more are answered HTTP 503 and closed", parse=flag_values.positive))
    metrics_idle_timeout_s: float = field(default=METRICS_IDLE_TIMEOUT_S, metadata=flag(
        "--metrics-idle-timeout", "seconds a metrics connection may go without a byte either "
        "way before it is closed", parse=flag_values.positive_float))
    warmup_on_start: bool = field(default=True, metadata=flag(
        "--warmup-on-start", "run the warmup plan once the model is loaded (health answers "
        "meanwhile)"))
    mixed_num_tokens: int | None = field(default=None, metadata=flag(
        "--mixed-num-tokens", "tokens of the plan's mixed prefill+decode phase (default: the "
        "plan's)", parse=flag_values.non_negative))
    log_level: str = field(default="INFO", metadata=flag(
        "--log-level", ", ".join(flag_values.LOG_LEVELS), parse=flag_values.log_level))
    shutdown_grace_s: float = field(default=5.0, metadata=flag(
        "--shutdown-grace", "seconds in-flight RPCs get on SIGTERM before they are cancelled",
        parse=flag_values.positive_float))
    # The kubelet's probe speaks neither TLS nor tokens, hence a second, plaintext port.
    health_port: int = field(default=HEALTH_PORT_DISABLED, metadata=flag(
        "--health-port", "plaintext port serving only grpc.health.v1, for probes when the "
        "main port uses TLS or tokens; 0 picks a free one, -1 disables it",
        parse=flag_values.optional_port))
    # Each open watch costs memory and a status message per change on the event loop that
    # answers health; 3,000 unbounded follow streams slowed a health Check to 1.7 s.
    max_status_watchers: int = field(default=64, metadata=flag(
        "--max-status-watchers", "WatchStatus streams open at once, at most; more are answered "
        "RESOURCE_EXHAUSTED", parse=flag_values.positive))
    max_health_watchers: int = field(default=MAX_HEALTH_WATCHERS, metadata=flag(
        "--max-health-watchers", "grpc.health.v1 Watch streams open at once on each port "
        "that serves health (the main port, --health-port); more are answered "
        "RESOURCE_EXHAUSTED", parse=flag_values.positive))
    # The default is plaintext and open.
    security: ServerSecurity = field(default_factory=ServerSecurity)
    # Test-only faults (WARMGATE_FAULT_INJECT, no flag); empty in every real deployment.
    faults: tuple[Fault, ...] = ()
    # See warmgate.server.jit.strict.
    strict_jit: str = field(default="warn", metadata=flag(
        "--strict-jit", "a JIT compile after ready: off (count it), warn (log the batch that "
        "caused it) or fail (also turn health NOT_SERVING, state FAILED)",
        parse=flag_values.strict_jit))
    # None: the libraries' own cache directories (warmgate.server.cache).
    cache_dir: str | None = field(default=None, metadata=flag(
        "--cache-dir", "shared compile cache directory: one locked entry per cache key, "
        "holding Triton's, FlashInfer's and inductor's caches"))
    cache_lock_timeout_s: float = field(default=CACHE_LOCK_TIMEOUT_S, metadata=flag(
        "--cache-lock-timeout", "seconds to wait for another process filling the same cache "
        "entry (then run without the cache)", parse=flag_values.positive_float))
    warmup_only: bool = field(default=False, metadata=flag(
        "--warmup-only", "load, warm up, fill --cache-dir, print the report and exit (0: "
        "succeeded); binds no port (a Kubernetes Job, an image build)"))
    json_output: bool = field(default=False, metadata=flag(
        "--json", "with --warmup-only: print the report as JSON"))
    serving: ServingConfig = field(default_factory=ServingConfig)
    # control/engine_client.py: the step loop shares no GIL with gRPC.
    engine_process: bool = field(default=True, metadata=flag(
        "--engine-process", "run the runner, the warmup and the serving loop in a child "
        "process (engine_main); --no-engine-process runs them in this one"))
    engine_step_timeout_s: float = field(default=60.0, metadata=flag(
        "--engine-step-timeout", "seconds a serving step in the engine process may go without "
        "a word before it counts as hung: the engine is killed and the server exits non-zero",
        parse=flag_values.positive_float))
    # cpu_threads.py applies it.
    cpu_threads: int = field(default=0, metadata=flag(
        "--cpu-threads", "torch intra-op threads; 0: on a CPU device every usable core but one "
        "(the event loop and gRPC need one), on CUDA torch's default",
        parse=flag_values.non_negative))

    @property
    def metrics_enabled(self) -> bool:
        return self.metrics_port != METRICS_DISABLED

    @property
    def health_port_enabled(self) -> bool:
        return self.health_port != HEALTH_PORT_DISABLED


FLAG_OPTIONS: tuple[Option, ...] = tuple(options_of(ServerConfig))
# The flags that shape a runner, for the tools that build one without a server
# (`python -m warmgate.server.run_warmup`, bench/): the server's names, parsing and defaults.
RUNNER_FLAGS = tuple(o.flag for o in FLAG_OPTIONS if o.path.startswith("runner."))


def add_options(parser: argparse.ArgumentParser, flags: Sequence[str],
                environ: Mapping[str, str], defaults: Mapping[str, Any] | None = None) -> None:
    """Add the named server options to `parser` (see config.flags.add_options)."""
    _add_options(parser, FLAG_OPTIONS, flags, environ, defaults)


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The server's parser over these environment defaults. One start asks for it three times
    (the health process's port, the CUDA context's device, the whole configuration) with the
    same environment, and building one costs more than it seems on a pod's first start
    (argparse looks its messages up in the locale directories), so a parser is built once per
    set of WARMGATE_ values and shared: parsing does not change it."""
    return _parser_for(tuple(environ.get(opt.env) for opt in FLAG_OPTIONS))


@functools.lru_cache(maxsize=8)
def _parser_for(values: tuple[str | None, ...]) -> argparse.ArgumentParser:
    environ = {opt.env: v for opt, v in zip(FLAG_OPTIONS, values, strict=True) if v is not None}
    parser = OneLineParser(
        prog=PROG,
        description="Serve warmgate.v1.Warmup, health and metrics; warm the model's kernels. "
                    f"Every flag defaults to its {ENV_PREFIX}<FLAG> environment variable.")
    add_options(parser, [opt.flag for opt in FLAG_OPTIONS], environ)
    return parser


def report_config_error(parser: argparse.ArgumentParser, exc: ConfigError) -> NoReturn:
    """Exit 2 with argparse's message for the flag behind a ConfigError's field."""
    parser.error(f"argument {flag_for(FLAG_OPTIONS, exc.field_name)}: {exc.message}")


def model_error(model: str, exc: Exception) -> ConfigError:
    """A model directory that cannot load, as the ConfigError naming the flag to change."""
    if isinstance(exc, ModelLoadError):
        return ConfigError("model.max_model_len" if exc.key == "max_model_len" else "model",
                           str(exc))
    return ConfigError("model", f"cannot read the model in {model}: "
                                f"{type(exc).__name__}: {exc}")


def _model_config(model: str, max_model_len: int | None) -> ModelConfig:
    overrides = {} if max_model_len is None else {"max_model_len": max_model_len}
    if model in MODEL_PRESETS:
        return ModelConfig.from_preset(model, **overrides)
    if os.path.isdir(model):
        try:
            check_inside_model_dir(model)
        except ModelFileError as exc:  # names the file
            raise ConfigError("model", str(exc)) from None
        try:
            return model_config_from_hf(model, **overrides)
        except ConfigError:  # already names its flag
            raise
        except (ValueError, OSError) as exc:  # any unreadable model: one line, not a trace
            raise model_error(model, exc) from None
    raise ConfigError("model", f"{model!r} is neither a preset ({', '.join(preset_names())}) "
                               "nor a local directory")


def runner_config_from_args(args: argparse.Namespace) -> RunnerConfig:
    """The (unresolved) runner the RUNNER_FLAGS in `args` describe; ConfigError names the
    bad field. A model directory's config.json is read; its weight files are not (see
    warmgate.server.startup)."""
    model = _model_config(args.model, args.max_model_len)
    runner: RunnerConfig = build(RunnerConfig, values_by_path(FLAG_OPTIONS, args), "runner.",
                                 {"runner.model": model})
    return runner


def check_mixed_num_tokens(parser: argparse.ArgumentParser, args: argparse.Namespace,
                           runner: RunnerConfig) -> None:
    budget = runner.scheduler.max_num_batched_tokens
    if args.mixed_num_tokens is not None and args.mixed_num_tokens > budget:
        parser.error(f"argument --mixed-num-tokens: {args.mixed_num_tokens} is more than "
                     f"--max-num-batched-tokens ({budget})")


def server_config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                            runner: RunnerConfig, environ: Mapping[str, str]) -> ServerConfig:
    """The ServerConfig around `runner`: reads the TLS and token files and the fault spec;
    exits 2 naming the flag (or variable) of anything unusable."""
    try:
        security = load_server_security(
            auth_token_file=args.auth_token_file, tls_cert=args.tls_cert,
            tls_key=args.tls_key, tls_client_ca=args.tls_client_ca)
    except SecurityConfigError as exc:
        parser.error(f"argument {exc.flag}: {exc.message}")
    values = values_by_path(FLAG_OPTIONS, args)
    try:
        serving: ServingConfig = build(ServingConfig, values, "serving.")
    except ConfigError as exc:
        report_config_error(parser, exc)
    try:
        faults = parse_faults(environ.get(FAULT_ENV_VAR, ""))
    except ValueError as exc:
        parser.error(f"{FAULT_ENV_VAR}: {exc}")
    config: ServerConfig = build(ServerConfig, values, "", {
        "runner": runner, "security": security, "serving": serving, "faults": faults})
    return config


def configure_logging(config: ServerConfig) -> None:
    logging.basicConfig(level=getattr(logging, config.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
