"""The server's configuration, resolved in one function from CLI flags and the environment.

Precedence: a flag beats its `WARMGATE_<FLAG>` environment variable, which beats the default
(`--max-num-seqs` <- `WARMGATE_MAX_NUM_SEQS`). Nothing is read at import time: the caller hands
in argv and environ, so tests never touch the real environment.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from warmgate.server.api.security import (
    SecurityConfigError,
    ServerSecurity,
    load_server_security,
)
from warmgate.server.config.presets import MODEL_PRESETS, preset_names
from warmgate.server.config.runner_config import (
    CacheConfig,
    CompilationConfig,
    ConfigError,
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    SpeculativeConfig,
    resolve_runner_config,
)
from warmgate.server.config.startup_checks import check_attention_backend
from warmgate.server.control.faults import ENV_VAR as FAULT_ENV_VAR
from warmgate.server.control.faults import Fault, parse_faults
from warmgate.server.jit.strict import STRICT_MODES
from warmgate.server.serving.config import ServingConfig

ENV_PREFIX = "WARMGATE_"
# Waiting on another process filling the cache entry, plus a cold warmup of its own when the
# wait times out, must fit the GPU startupProbe's budget (deploy/components/gpu): past it the
# kubelet kills the pod and it queues again. .ci/check_manifests.py checks the fit.
CACHE_LOCK_TIMEOUT_S = 240.0
# -1 turns the metrics endpoint off; 0 binds a free port (tests), reported after start.
METRICS_DISABLED = -1
HEALTH_PORT_DISABLED = -1
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class ServerConfig:
    runner: RunnerConfig
    host: str = "0.0.0.0"
    # 0 binds a free port; create_server returns the one it got.
    port: int = 50051
    metrics_port: int = 9464
    # Start the warmup plan as soon as the model is loaded (health answers meanwhile).
    warmup_on_start: bool = True
    # Tokens of the plan's mixed phase; None lets the plan choose.
    mixed_num_tokens: int | None = None
    log_level: str = "INFO"
    # Seconds in-flight RPCs get to finish on SIGTERM before they are cancelled.
    shutdown_grace_s: float = 5.0
    # A second, plaintext port serving only grpc.health.v1 (the kubelet's probe speaks
    # neither TLS nor tokens); -1: none, 0: a free port.
    health_port: int = HEALTH_PORT_DISABLED
    # TLS/mTLS and bearer tokens for the main port; the default is plaintext and open.
    security: ServerSecurity = field(default_factory=ServerSecurity)
    # Test-only faults (WARMGATE_FAULT_INJECT); empty in every real deployment.
    faults: tuple[Fault, ...] = ()
    # A JIT compile after ready: off (count only), warn (log it with the batch that caused
    # it) or fail (also state FAILED and health NOT_SERVING); see warmgate.server.jit.strict.
    strict_jit: str = "warn"
    # The shared compile cache (warmgate.server.cache); None: the libraries' defaults.
    cache_dir: str | None = None
    cache_lock_timeout_s: float = CACHE_LOCK_TIMEOUT_S
    # Load, warm, fill the cache, print the report and exit; never bind a port.
    warmup_only: bool = False
    json_output: bool = False
    # The Generate RPC's scheduler and drafter settings.
    serving: ServingConfig = field(default_factory=ServingConfig)
    # torch intra-op threads; 0: all usable cores but one on a CPU device (cpu_threads.py).
    cpu_threads: int = 0

    @property
    def metrics_enabled(self) -> bool:
        return self.metrics_port != METRICS_DISABLED

    @property
    def health_port_enabled(self) -> bool:
        return self.health_port != HEALTH_PORT_DISABLED


# ConfigError.field_name -> the flag that sets it, so a validation error names the flag.
_FIELD_FLAGS = {
    "model": "--model",
    "model.max_model_len": "--max-model-len",
    "cache.block_size": "--block-size",
    "cache.num_blocks": "--num-blocks",
    "scheduler.max_num_seqs": "--max-num-seqs",
    "scheduler.max_num_batched_tokens": "--max-num-batched-tokens",
    "speculative.num_speculative_steps": "--num-speculative-steps",
    "device.device": "--device",
    "device.dtype": "--dtype",
    "device.attention_backend": "--attention-backend",
    "serving.ngram_min": "--ngram-min",
    "serving.max_waiting_requests": "--max-waiting-requests",
}


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be between 0 and 65535")
    return value


def _metrics_port(text: str) -> int:
    value = int(text)
    if value != METRICS_DISABLED and not 0 <= value <= 65535:
        raise ValueError("must be between 0 and 65535, or -1 to disable")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    # NaN compares false with everything: unchecked, a NaN timeout waits forever.
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a finite number > 0")
    return value


def _attention_backend(text: str) -> str:
    from warmgate.server.runner.attention import backend_names  # lazy: imports torch

    choices = ("auto", *backend_names())
    if text not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}")
    return text


def _log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def _strict_jit(text: str) -> str:
    if text.lower() not in STRICT_MODES:
        raise ValueError(f"must be one of {', '.join(STRICT_MODES)}")
    return text.lower()


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


@dataclass(frozen=True)
class _Option:
    flag: str
    parse: Callable[[str], Any]
    default: Any
    help: str

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


_OPTIONS = (
    _Option("--model", str, "tiny",
            f"a preset ({', '.join(preset_names())}) or a local Hugging Face directory"),
    _Option("--host", str, "0.0.0.0", "address the gRPC and metrics servers bind"),
    _Option("--port", _port, 50051, "gRPC port; 0 picks a free one"),
    _Option("--metrics-port", _metrics_port, 9464,
            "Prometheus port; 0 picks a free one, -1 disables the endpoint"),
    _Option("--num-speculative-steps", _non_negative, 0, "draft tokens per decode step"),
    _Option("--max-num-seqs", int, 8, "requests per batch"),
    _Option("--max-num-batched-tokens", int, 256, "tokens per batch"),
    _Option("--max-model-len", int, None, "context length (default: the model's)"),
    _Option("--num-blocks", int, None, "KV cache blocks (default: enough for max-num-seqs "
            "full-length requests)"),
    _Option("--block-size", int, 16, "tokens per KV cache block"),
    _Option("--device", str, "auto", "auto, cpu, cuda or cuda:N"),
    _Option("--dtype", str, "auto", "auto, float32, bfloat16 or float16"),
    _Option("--attention-backend", _attention_backend, "auto",
            "auto, torch, triton or flashinfer"),
    _Option("--mixed-num-tokens", _non_negative, None,
            "tokens of the plan's mixed prefill+decode phase (default: the plan's)"),
    _Option("--log-level", _log_level, "INFO", ", ".join(LOG_LEVELS)),
    _Option("--shutdown-grace", _positive_float, 5.0,
            "seconds in-flight RPCs get on SIGTERM"),
    _Option("--health-port", _metrics_port, HEALTH_PORT_DISABLED,
            "plaintext port serving only grpc.health.v1, for probes when the main port uses "
            "TLS or tokens; 0 picks a free one, -1 disables it"),
    _Option("--auth-token-file", str, None,
            "file of bearer tokens (one per line); WarmupKernels, MixedWarmup and any other "
            "mutating RPC then need 'authorization: Bearer <token>'"),
    _Option("--tls-cert", str, None, "PEM certificate chain: serve the main port over TLS"),
    _Option("--tls-key", str, None, "PEM private key of --tls-cert"),
    _Option("--tls-client-ca", str, None,
            "PEM CA bundle: require client certificates signed by it (mTLS)"),
    _Option("--strict-jit", _strict_jit, "warn",
            "a JIT compile after ready: off (count it), warn (log the batch that caused it) "
            "or fail (also turn health NOT_SERVING, state FAILED)"),
    _Option("--cache-dir", str, None, "shared compile cache directory: one locked entry per "
            "cache key, holding Triton's, FlashInfer's and inductor's caches"),
    _Option("--cache-lock-timeout", _positive_float, CACHE_LOCK_TIMEOUT_S,
            "seconds to wait for another process filling the same cache entry (then run "
            "without the cache)"),
    _Option("--ngram-min", int, 1, "smallest suffix n-gram the speculative drafter matches"),
    _Option("--ngram-max", int, 4, "largest suffix n-gram the speculative drafter matches "
            "(tried first)"),
    _Option("--cpu-threads", _non_negative, 0, "torch intra-op threads; 0: on a CPU device "
            "every usable core but one (the event loop and gRPC need one), on CUDA torch's "
            "default"),
    _Option("--max-waiting-requests", int, 1024, "Generate requests queued for a batch slot, "
            "at most; more are answered RESOURCE_EXHAUSTED"),
)
_BOOL_OPTIONS = (
    _Option("--warmup-on-start", _bool, True, "run the warmup plan once the model is loaded"),
    _Option("--cuda-graphs", _bool, True, "capture uniform-decode CUDA graphs"),
    _Option("--ragged-cuda-graphs", _bool, True, "with --cuda-graphs, also capture prefill and "
            "mixed batches, one graph per token bucket (triton backend; others run them "
            "eagerly)"),
    _Option("--compile", _bool, False, "torch.compile the model's dense layers, one graph per "
            "token bucket, all compiled by the warmup's compile phase"),
    _Option("--shape-sweeps", _bool, True, "on CUDA, run every dense GEMM shape (token "
            "counts 1..max-num-batched-tokens) and the sampler at every batch size before "
            "ready, so no first batch of a new size waits for cuBLAS or kernel loading"),
    _Option("--warmup-only", _bool, False, "load, warm up, fill --cache-dir, print the report "
            "and exit (0: succeeded); binds no port (a Kubernetes Job, an image build)"),
    _Option("--json", _bool, False, "with --warmup-only: print the report as JSON"),
    _Option("--serve-before-ready", _bool, False, "answer Generate before the warmup plan "
            "succeeded (the first requests then pay for the compiles); off: UNAVAILABLE until "
            "ready"),
)


def _argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn a ValueError's message into argparse's 'argument --x: ...' error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: {exc}") from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


# The flags that shape a runner, for the tools that build one without a server
# (`python -m warmgate.server.warmup`, bench/): the server's names, parsing and defaults.
RUNNER_FLAGS = ("--model", "--num-speculative-steps", "--max-num-seqs",
                "--max-num-batched-tokens", "--max-model-len", "--num-blocks", "--block-size",
                "--device", "--dtype", "--attention-backend", "--cuda-graphs",
                "--ragged-cuda-graphs", "--compile", "--shape-sweeps")


def add_options(parser: argparse.ArgumentParser, flags: Sequence[str],
                environ: Mapping[str, str], defaults: Mapping[str, Any] | None = None) -> None:
    """Add the named server options to `parser`, each defaulting to its environment variable,
    else to `defaults[flag]`, else to the server's default."""
    by_flag = {opt.flag: opt for opt in _OPTIONS + _BOOL_OPTIONS}
    unknown = [f for f in flags if f not in by_flag]
    if unknown:
        raise ValueError(f"no such server options: {', '.join(unknown)}")
    for flag in flags:
        opt = by_flag[flag]
        default = (defaults or {}).get(flag, opt.default)
        raw = environ.get(opt.env)
        if raw is not None:
            try:
                default = opt.parse(raw)
            except ValueError as exc:
                parser.error(f"argument {opt.flag}: invalid value {raw!r} from {opt.env}: {exc}")
        text = f"{opt.help} (env {opt.env}; default {default})"
        if opt in _BOOL_OPTIONS:
            parser.add_argument(opt.flag, dest=opt.dest, default=default, help=text,
                                action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(opt.flag, dest=opt.dest, default=default, help=text,
                                type=_argtype(opt.parse))


PROG = "warmgate-server"


def startup_error(message: str) -> NoReturn:
    """One line naming the flag (or file) on stderr, exit 2: a start-up that can never work
    says why in a line a log collector keeps whole, never with a usage dump or a traceback."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        startup_error(f"{message} (see {PROG} --help)")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=PROG,
        description="Serve warmgate.v1.Warmup, health and metrics; warm the model's kernels. "
                    f"Every flag defaults to its {ENV_PREFIX}<FLAG> environment variable.")
    add_options(parser, [opt.flag for opt in _OPTIONS + _BOOL_OPTIONS], environ)
    return parser


def _model_config(model: str, max_model_len: int | None) -> ModelConfig:
    overrides = {} if max_model_len is None else {"max_model_len": max_model_len}
    if model in MODEL_PRESETS:
        return ModelConfig.from_preset(model, **overrides)
    if os.path.isdir(model):
        from warmgate.server.runner.weights import (  # torch
            WeightsError,
            check_config_matches,
            index_weight_files,
            model_config_from_hf,
        )

        try:
            config = model_config_from_hf(model, **overrides)
            # The load's own checks, now: the context against the checkpoint's positions, and
            # tensor names and shapes from the file headers. A directory that can never load
            # is refused at start-up rather than after the server has started.
            check_config_matches(config, model)
            index_weight_files(model, config)
            return config
        except WeightsError as exc:
            field = "model.max_model_len" if exc.key == "max_model_len" else "model"
            raise ConfigError(field, str(exc)) from None
        except ConfigError:  # already names its flag
            raise
        except (ValueError, OSError) as exc:  # any other unreadable model: one line, not a trace
            raise ConfigError("model", f"cannot read the model in {model}: "
                                       f"{type(exc).__name__}: {exc}") from None
    raise ConfigError("model", f"{model!r} is neither a preset ({', '.join(preset_names())}) "
                               "nor a local directory")


def runner_config_from_args(args: argparse.Namespace) -> RunnerConfig:
    """The (unresolved) runner the RUNNER_FLAGS in `args` describe; ConfigError names the
    bad field."""
    return RunnerConfig(
        model=_model_config(args.model, args.max_model_len),
        cache=CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs,
                                  max_num_batched_tokens=args.max_num_batched_tokens),
        speculative=SpeculativeConfig(num_speculative_steps=args.num_speculative_steps),
        device=DeviceConfig(device=args.device, dtype=args.dtype,
                            attention_backend=args.attention_backend),
        compilation=CompilationConfig(enable_cuda_graphs=args.cuda_graphs,
                                      ragged_cuda_graphs=args.ragged_cuda_graphs,
                                      compile=args.compile, shape_sweeps=args.shape_sweeps),
    )


def report_config_error(parser: argparse.ArgumentParser, exc: ConfigError) -> NoReturn:
    """Exit 2 with argparse's message for the flag behind a ConfigError's field."""
    flag = _FIELD_FLAGS.get(exc.field_name, exc.field_name)
    parser.error(f"argument {flag}: {exc.message}")


def _check_warmup_capacity(runner: RunnerConfig, mixed_num_tokens: int | None) -> None:
    """A configuration whose warmup plan can never succeed can never serve: fail now."""
    from warmgate.server.warmup.shapes import check_config_capacity  # imports the runner

    check_config_capacity(runner, mixed_num_tokens)


def load_server_config(argv: Sequence[str] | None = None,
                       environ: Mapping[str, str] | None = None, *,
                       resolve: bool = True) -> ServerConfig:
    """Parse flags over environment defaults; exit 2 with a message naming the bad flag.

    `resolve` turns every "auto" into a concrete device, dtype and backend now, so an
    impossible choice (`--device cuda` without CUDA) fails at start-up, naming its flag.
    """
    environ = os.environ if environ is None else environ
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    try:
        runner = runner_config_from_args(args)
        if resolve:
            runner = resolve_runner_config(runner)
    except ConfigError as exc:
        report_config_error(parser, exc)
    if args.mixed_num_tokens is not None and \
            args.mixed_num_tokens > runner.scheduler.max_num_batched_tokens:
        parser.error(f"argument --mixed-num-tokens: {args.mixed_num_tokens} is more than "
                     f"--max-num-batched-tokens ({runner.scheduler.max_num_batched_tokens})")
    if resolve:
        try:
            check_attention_backend(runner, environ)
            _check_warmup_capacity(runner, args.mixed_num_tokens)
        except ConfigError as exc:
            report_config_error(parser, exc)
    try:
        security = load_server_security(
            auth_token_file=args.auth_token_file, tls_cert=args.tls_cert,
            tls_key=args.tls_key, tls_client_ca=args.tls_client_ca)
    except SecurityConfigError as exc:
        parser.error(f"argument {exc.flag}: {exc.message}")
    try:
        serving = ServingConfig(serve_before_ready=args.serve_before_ready,
                                ngram_min=args.ngram_min, ngram_max=args.ngram_max,
                                max_waiting_requests=args.max_waiting_requests)
    except ConfigError as exc:
        report_config_error(parser, exc)
    try:
        faults = parse_faults(environ.get(FAULT_ENV_VAR, ""))
    except ValueError as exc:
        parser.error(f"{FAULT_ENV_VAR}: {exc}")
    return ServerConfig(runner=runner, host=args.host, port=args.port,
                        metrics_port=args.metrics_port, warmup_on_start=args.warmup_on_start,
                        mixed_num_tokens=args.mixed_num_tokens, log_level=args.log_level,
                        shutdown_grace_s=args.shutdown_grace, health_port=args.health_port,
                        security=security, faults=faults, strict_jit=args.strict_jit,
                        cache_dir=args.cache_dir, cache_lock_timeout_s=args.cache_lock_timeout,
                        warmup_only=args.warmup_only, json_output=args.json,
                        serving=serving, cpu_threads=args.cpu_threads)


def configure_logging(config: ServerConfig) -> None:
    logging.basicConfig(level=getattr(logging, config.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

