"""The model runner's two timed start-up steps: the model with its weights, and the paged KV
cache. Each returns what it built and how long it took, which the load phase reports."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.runner.fp8_weights import describe
from warmgate.server.runner.kv_cache import (
    FullAttentionSpec,
    KVCacheConfig,
    allocate_kv_cache,
    kv_cache_bytes,
)
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.weights import init_random_weights, load_weights

if TYPE_CHECKING:
    from warmgate.server.runner.tensor_parallel import TensorParallel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadStats:
    weights_s: float
    weights_bytes: int
    # "random" or the weights directory.
    weights_source: str
    kv_cache_s: float
    kv_cache_bytes: int


@dataclass(frozen=True)
class LoadedModel:
    model: LlamaModel
    seconds: float
    num_bytes: int


@dataclass(frozen=True)
class AllocatedKVCache:
    kv_caches: list[torch.Tensor]
    kv_cache_config: KVCacheConfig
    seconds: float
    num_bytes: int


def load_stats(config: RunnerConfig, model: LoadedModel, kv: AllocatedKVCache) -> LoadStats:
    return LoadStats(weights_s=model.seconds, weights_bytes=model.num_bytes,
                     weights_source=config.model.weights_path or "random",
                     kv_cache_s=kv.seconds, kv_cache_bytes=kv.num_bytes)


def _sync(device: torch.device) -> None:
    # Timings are read after a sync, or they measure only the kernel launches.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_model(config: RunnerConfig, ops: TorchOps, device: torch.device,
               dtype: torch.dtype, tp: TensorParallel | None = None,
               on_built: Callable[[LlamaModel], None] | None = None) -> LoadedModel:
    """Build the model without an attention backend (the runner attaches one once the KV cache
    exists) and fill it from the weights directory, or with seeded random weights; with `tp`,
    this rank's shard of it. `on_built` gets the model once its tensors exist, before they
    are filled."""
    mc = config.model
    start = time.perf_counter()
    model = LlamaModel(mc, ops, None, device, dtype, tp)
    if on_built is not None:
        on_built(model)
    if mc.weights_path is not None:
        num_bytes = load_weights(mc.weights_path, model)
    else:
        if mc.fp8 is not None:
            logger.info("model %s: random %s", mc.name, describe(mc.fp8))
        init_random_weights(model, mc.seed)
        num_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    _sync(device)
    seconds = time.perf_counter() - start
    logger.info("weights: %s, %.1f MiB in %.2f s", mc.weights_path or f"random (seed "
                f"{mc.seed})", num_bytes / 2**20, seconds)
    return LoadedModel(model, seconds, num_bytes)


def allocate_kv(config: RunnerConfig, device: torch.device, dtype: torch.dtype,
                num_kv_heads: int | None = None) -> AllocatedKVCache:
    """One paged KV tensor per layer, config.cache.num_blocks blocks each, of num_kv_heads
    heads (default: the model's; a tensor-parallel rank holds fewer)."""
    mc, num_blocks = config.model, config.cache.num_blocks
    assert num_blocks is not None  # guaranteed by is_resolved; narrows the type
    start = time.perf_counter()
    heads = mc.num_kv_heads if num_kv_heads is None else num_kv_heads
    spec = FullAttentionSpec(block_size=config.cache.block_size, num_kv_heads=heads,
                             head_size=mc.head_dim, dtype=dtype)
    kv_caches, kv_cache_config = allocate_kv_cache(mc.num_layers, num_blocks, spec, device)
    _sync(device)
    return AllocatedKVCache(kv_caches, kv_cache_config, time.perf_counter() - start,
                            kv_cache_bytes(mc.num_layers, num_blocks, spec))
