"""The start-up checks config can make alone: an attention backend that cannot run here, a MoE
expert shape the fused kernel cannot take on CUDA, and on a CPU a max_model_len whose caches
the host memory cannot hold.

Each raises ConfigError naming the setting, which load_server_config (warmgate.server.startup,
beside the checks that need the runner or the warmup plan) turns into one line naming the
flag and exit code 2: the runner would otherwise only find out after the server bound its
ports and said it was starting.
"""

from __future__ import annotations

from collections.abc import Mapping

from warmgate.server.config.attention_backends import backend_available, head_dim_problem
from warmgate.server.config.moe_kernel import check_moe_kernel_shape
from warmgate.server.config.runner_config import ConfigError, RunnerConfig

# Backends whose kernels run only on a GPU. Triton's interpreter (TRITON_INTERPRET=1) runs
# triton kernels on the CPU, which the tests use; FlashInfer has no such mode.
_GPU_ONLY_BACKENDS = ("triton", "flashinfer")
TRITON_INTERPRET_VAR = "TRITON_INTERPRET"


def check_attention_backend(runner: RunnerConfig, environ: Mapping[str, str]) -> None:
    """The resolved backend can run on the resolved device, and its library is installed."""
    backend, device = runner.device.attention_backend, runner.device.device
    if backend in _GPU_ONLY_BACKENDS and not device.startswith("cuda"):
        interpreted = backend == "triton" and environ.get(TRITON_INTERPRET_VAR) == "1"
        if not interpreted:
            raise ConfigError("device.attention_backend",
                              f"{backend} needs a CUDA device but --device is {device}; "
                              "use --attention-backend torch (or auto) on a CPU")
    problem = head_dim_problem(backend, runner.model.head_dim)
    if problem is not None:
        raise ConfigError("device.attention_backend",
                          f"{problem}: use --attention-backend triton (or auto)")
    if not backend_available(backend):
        raise ConfigError("device.attention_backend",
                          f"{backend} was asked for but its Python package is not installed")


def check_moe_kernel(runner: RunnerConfig) -> None:
    """On CUDA, where the fused MoE kernel runs, the model's expert shape fits it."""
    if runner.device.device.startswith("cuda"):
        check_moe_kernel_shape(runner.model)


# Bytes per element of each --dtype the runner serves in (resolved: never "auto").
SERVED_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# int32 block ids; the input batch keeps a host copy and a device copy of the table.
_BLOCK_TABLE_BYTES = 4 * 2


def length_sized_bytes(runner: RunnerConfig) -> dict[str, int]:
    """The host bytes a resolved CPU runner allocates in proportion to max_model_len (or to
    the block count, which max_model_len sizes unless --num-blocks is given): the rope
    cos/sin cache, the paged KV cache and the block tables."""
    model, cache = runner.model, runner.cache
    assert cache.num_blocks is not None  # resolved
    page = 2 * cache.block_size * model.num_kv_heads * model.head_dim * SERVED_DTYPE_BYTES.get(
        runner.device.dtype, 4)
    return {"rope cache": model.max_model_len * model.head_dim * 4,
            "KV cache": model.num_layers * cache.num_blocks * page,
            "block tables": runner.scheduler.max_num_seqs * runner.max_blocks_per_req
            * _BLOCK_TABLE_BYTES}


def check_host_memory(runner: RunnerConfig, available: int | None) -> None:
    """On a CPU, what max_model_len sizes must fit the host's available memory: past it the
    load would not fail cleanly but run into the OOM killer, or allocate gigabytes before
    failing (a config.json declaring 20M positions for a 0.5 MB model)."""
    if available is None or runner.device.device != "cpu":
        return  # a GPU's allocator refuses what it cannot back, with an error the load reports
    sizes = length_sized_bytes(runner)
    total = sum(sizes.values())
    if total <= available:
        return
    automatic = runner.scheduler.max_num_seqs * runner.max_blocks_per_req + 1
    field_name = ("model.max_model_len" if runner.cache.num_blocks == automatic
                  else "cache.num_blocks")
    parts = ", ".join(f"{name} {size / 2**30:.2f} GiB" for name, size in sizes.items())
    raise ConfigError(field_name, f"max_model_len {runner.model.max_model_len} with "
                      f"{runner.cache.num_blocks} KV blocks needs {total / 2**30:.2f} GiB of "
                      f"host memory ({parts}), {available / 2**30:.2f} GiB available; lower "
                      "--max-model-len (it defaults to the model's max_position_embeddings), "
                      "--num-blocks or --max-num-seqs")
