"""The compile cache's key: sha256 of everything that changes the code the warmup compiles.

Weights' values, the model's name and the seed do not change compiled code, so they are not
in the key (two checkpoints of one architecture share an entry); shapes, dtypes, the batch
limits and capture sizes that the kernels specialise on, the compilers' versions and the GPU
are. The inputs are stored beside the entry as key.json, so a miss can be explained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import platform
from collections.abc import Mapping
from typing import Any

from warmgate.server.config.runner_config import RunnerConfig

KEY_SCHEMA = 1
# Distributions whose versions change compiled code (FlashInfer's wheel is flashinfer-python).
VERSIONED_DISTS = ("warmgate", "torch", "triton", "flashinfer-python")
# architecture adds layers (biases, q/k norms) to the compiled graphs; rope (a dict of its
# fields) decides the cos/sin values baked into a graph when it is traced with them as constants.
_MODEL_FIELDS = ("architecture", "vocab_size", "hidden_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "intermediate_size", "max_model_len", "rope",
                 "rms_norm_eps", "tie_word_embeddings", "is_pooling_model")
# Only a MoE model's key names them: a dense model's key (and its cache entries) stays as it
# was before MoE existed.
_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob")
ABSENT = "absent"


def _plain(value: Any) -> Any:
    """JSON-ready: nested config dataclasses (ModelConfig.rope) become dicts."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def dist_versions(names: tuple[str, ...] = VERSIONED_DISTS) -> dict[str, str]:
    """importlib.metadata versions; a missing distribution is "absent". Imports nothing."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = ABSENT
    return out


def gpu_identity(device: str) -> dict[str, str]:
    """The GPU's name and compute capability, or {"name": "cpu"} off CUDA.

    Reads torch.cuda only (initialises CUDA, which the runner does next anyway); never
    triton or flashinfer, whose cache locations must not be read before the key is known.
    """
    if not device.startswith("cuda"):
        return {"name": "cpu", "capability": "cpu"}
    import torch

    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return {"name": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}"}


def key_inputs(config: RunnerConfig, *, gpu: Mapping[str, str] | None = None,
               versions: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The key's inputs from a resolved config (`gpu` and `versions` default to this host)."""
    if not config.is_resolved:
        raise ValueError("the cache key needs a resolved RunnerConfig (no 'auto' values)")
    m = config.model
    compilation: dict[str, Any] = {
        "cuda_graph_sizes": list(config.compilation.cuda_graph_sizes or ()),
        # Read by name so the key tracks whatever compile switches CompilationConfig grows.
        "compile": bool(getattr(config.compilation, "compile", False)),
    }
    return {
        "schema": KEY_SCHEMA,
        "model": {name: _plain(getattr(m, name))
                  for name in _MODEL_FIELDS + (_MOE_FIELDS if m.num_experts else ())},
        "dtype": config.device.dtype,
        "device_type": config.device.device.split(":", 1)[0],
        "attention_backend": config.device.attention_backend,
        "block_size": config.cache.block_size,
        "num_speculative_steps": config.speculative.num_speculative_steps,
        "max_num_seqs": config.scheduler.max_num_seqs,
        "max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
        "compilation": compilation,
        "versions": dict(versions if versions is not None else dist_versions()),
        "python": ".".join(platform.python_version_tuple()[:2]),
        "gpu": dict(gpu if gpu is not None else gpu_identity(config.device.device)),
    }


def cache_key(inputs: Mapping[str, Any]) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()
