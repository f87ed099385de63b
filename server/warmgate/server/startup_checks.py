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


def _kernels_len(runner: RunnerConfig) -> int:
    """The longest sequence of the kernels phase: request 0's prompt plus every decode step
    it is in (warmup.kernels decode_plan), or 0 when the phase skips up front."""
    from warmgate.server.config import cdiv
    from warmgate.server.warmup.kernels import decode_plan, num_decode_steps  # imports torch

    k = runner.speculative.num_speculative_steps
    decode_query_len = 1 + k
    prompt_len = 1 + decode_query_len
    if runner.model.is_pooling_model:
        return prompt_len
    # The same caps as warmup.kernels.warmup_shapes (one KV cache group: this model's).
    block_size = runner.cache.block_size
    worst_len = prompt_len + num_decode_steps(k) * decode_query_len
    usable_blocks = (runner.cache.num_blocks or 0) - 1
    per_tokens = runner.scheduler.max_num_batched_tokens // max(prompt_len, decode_query_len)
    if per_tokens < 1 or usable_blocks < cdiv(worst_len, block_size):
        return 0  # the phase skips (budget or KV blocks): it builds no sequence
    num_reqs = min(runner.scheduler.max_num_seqs, per_tokens,
                   max(1, usable_blocks // cdiv(worst_len, block_size)))
    steps = decode_plan(min(num_reqs, 2), k)  # request 0's steps are the same from 2 up
    return prompt_len + sum(1 + (k if drafts else 0)
                            for rows in steps for index, drafts in rows if index == 0)


def _mixed_len(runner: RunnerConfig, mixed_num_tokens: int | None) -> int:
    """The mixed phase's prefill, or 0 when it skips (warmup.mixed's gates and capacity)."""
    from warmgate.server.config import cdiv
    from warmgate.server.warmup.mixed import DECODE_PROMPT_LEN  # imports torch
    from warmgate.server.warmup.plan import DEFAULT_MIXED_NUM_TOKENS

    budget = runner.scheduler.max_num_batched_tokens
    num_tokens = mixed_num_tokens or min(DEFAULT_MIXED_NUM_TOKENS, budget)
    block_size = runner.cache.block_size
    blocks = cdiv(DECODE_PROMPT_LEN + 1, block_size) + cdiv(num_tokens - 1, block_size)
    if (runner.model.is_pooling_model or runner.scheduler.max_num_seqs < 2 or num_tokens < 3
            or num_tokens > budget or blocks > (runner.cache.num_blocks or 0) - 1):
        return 0
    return max(num_tokens - 1, DECODE_PROMPT_LEN + 1)


def min_model_len_for_warmup(runner: RunnerConfig, mixed_num_tokens: int | None) -> int:
    """The longest sequence the warmup plan builds (on a resolved config): with a shorter
    context its requests are refused and the plan can never succeed."""
    return max(_kernels_len(runner), _mixed_len(runner, mixed_num_tokens), 2)


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
