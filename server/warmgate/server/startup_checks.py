"""Start-up checks for configurations that can never serve, run before anything binds.

Each raises ConfigError naming the setting, which load_server_config turns into one line
naming the flag and exit code 2. What they check is what the runner or the warmup plan would
otherwise only find out after the server bound its ports and said it was starting: an
attention backend that cannot run on the device, and a context too short for the warmup's
own requests (the server would stay FAILED forever).
"""

from __future__ import annotations

from collections.abc import Mapping

from warmgate.server.config import ConfigError, RunnerConfig

# Backends whose kernels run only on a GPU. Triton's interpreter (TRITON_INTERPRET=1) runs
# triton kernels on the CPU, which the tests use; FlashInfer has no such mode.
_GPU_ONLY_BACKENDS = ("triton", "flashinfer")
TRITON_INTERPRET_VAR = "TRITON_INTERPRET"


def check_attention_backend(runner: RunnerConfig, environ: Mapping[str, str]) -> None:
    """The resolved backend can run on the resolved device, and its library is installed."""
    from warmgate.server.runner.attention import backend_available  # lazy: imports torch

    backend, device = runner.device.attention_backend, runner.device.device
    if backend in _GPU_ONLY_BACKENDS and not device.startswith("cuda"):
        interpreted = backend == "triton" and environ.get(TRITON_INTERPRET_VAR) == "1"
        if not interpreted:
            raise ConfigError("device.attention_backend",
                              f"{backend} needs a CUDA device but --device is {device}; "
                              "use --attention-backend torch (or auto) on a CPU")
    if not backend_available(backend):
        raise ConfigError("device.attention_backend",
                          f"{backend} was asked for but its Python package is not installed")


def min_model_len_for_warmup(runner: RunnerConfig, mixed_num_tokens: int | None) -> int:
    """The longest sequence the warmup plan builds: below it the plan can never succeed.

    The kernels phase grows its requests to prompt + decode steps; the mixed phase prefills
    one request of (mixed tokens - 1) beside a decode, when it runs at all.
    """
    from warmgate.server.warmup.kernels import num_decode_steps  # lazy: imports torch
    from warmgate.server.warmup.mixed import DECODE_PROMPT_LEN
    from warmgate.server.warmup.plan import DEFAULT_MIXED_NUM_TOKENS

    k = runner.speculative.num_speculative_steps
    decode_query_len = 1 + k
    kernels = (1 + decode_query_len) + num_decode_steps(k) * decode_query_len
    budget = runner.scheduler.max_num_batched_tokens
    num_tokens = mixed_num_tokens or min(DEFAULT_MIXED_NUM_TOKENS, budget)
    mixed_runs = (runner.scheduler.max_num_seqs >= 2 and num_tokens >= 3
                  and not runner.model.is_pooling_model)
    mixed = max(num_tokens - 1, DECODE_PROMPT_LEN + 1) if mixed_runs else 0
    return max(kernels, mixed)


def check_model_len(runner: RunnerConfig, mixed_num_tokens: int | None) -> None:
    need = min_model_len_for_warmup(runner, mixed_num_tokens)
    have = runner.model.max_model_len
    if have < need:
        raise ConfigError("model.max_model_len",
                          f"{have} is too short for the warmup plan, whose requests reach "
                          f"{need} tokens (with --num-speculative-steps "
                          f"{runner.speculative.num_speculative_steps} and --mixed-num-tokens "
                          f"{mixed_num_tokens or 'default'}); the server could never be "
                          f"ready: use --max-model-len {need} or more")


def check_can_serve(runner: RunnerConfig, mixed_num_tokens: int | None,
                    environ: Mapping[str, str]) -> None:
    """Every check, on a resolved RunnerConfig."""
    check_attention_backend(runner, environ)
    check_model_len(runner, mixed_num_tokens)
