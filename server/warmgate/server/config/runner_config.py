"""The runner's configuration: one frozen, validated dataclass per concern.

What shapes compiled code lives here (and so in `config_hash` and the compile cache key);
the server's own settings are in server_config. A field with a flag declares it in its
metadata (config.flags). Nothing here reads the environment or probes devices at import
time: "auto" values are resolved in exactly one function, `resolve_runner_config`, at
start-up.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from warmgate.server.config import flag_values
from warmgate.server.config.attention_backends import backend_available, head_dim_problem
from warmgate.server.config.compilation_config import CompilationConfig, default_cuda_graph_sizes
from warmgate.server.config.config_error import ConfigError, _require
from warmgate.server.config.flags import flag
from warmgate.server.config.fp8_config import FP8Config, check_fp8, check_fp8_device
from warmgate.server.config.numerics_config import NumericsConfig, check_deterministic
from warmgate.server.config.pdl_support import check_pdl
from warmgate.server.config.presets import MODEL_PRESETS, PRESET_MAX_POSITIONS, preset_names
from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.config.scheduler_config import (
    CacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)

__all__ = ["ARCHITECTURES", "MOE_ARCHITECTURES", "CacheConfig", "CompilationConfig",
           "ConfigError", "DeviceConfig", "ModelConfig", "ParallelConfig", "RunnerConfig",
           "SchedulerConfig", "SpeculativeConfig", "cdiv", "default_cuda_graph_sizes",
           "resolve_runner_config"]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# The decoder variants runner.model implements (hf_config maps HF class names onto them).
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral")
# The Mixture-of-Experts variants: every layer's MLP is a routed set of SwiGLU experts.
MOE_ARCHITECTURES = ("qwen3_moe", "mixtral")


@dataclass(frozen=True)
class ModelConfig:
    name: str = field(default="tiny", metadata=flag(
        "--model", f"a preset ({', '.join(preset_names())}) or a local Hugging Face directory",
        direct=False, error_field="model"))
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    # Which decoder variant (ARCHITECTURES): llama and mistral share one layer; qwen2 adds
    # q/k/v projection biases; qwen3 adds a per-head RMSNorm on q and k before rotary.
    # qwen3_moe is qwen3's attention over a routed MoE MLP, mixtral mistral's.
    architecture: str = "llama"
    # Mixture of Experts (MOE_ARCHITECTURES only; 0 elsewhere): experts per layer, experts
    # each token is routed to, and each expert's SwiGLU width.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    # Renormalise the top-k routing weights to sum to 1 (Mixtral always does; Qwen3-MoE's
    # norm_topk_prob says).
    norm_topk_prob: bool = False
    # FP8 decoder projections and their scales (config.fp8_config); None: the served dtype.
    fp8: FP8Config | None = None
    rope: RopeConfig = field(default_factory=RopeConfig)
    # Attention over the last `sliding_window` tokens only; None means full attention. Only
    # a window that never bites (>= max_model_len) is supported.
    sliding_window: int | None = None
    rms_norm_eps: float = 1e-6
    max_model_len: int = field(default=512, metadata=flag(
        "--max-model-len", "context length (default: the model's)", default=None,
        direct=False))
    tie_word_embeddings: bool = False
    # A pooling (embedding) model returns pooled hidden states instead of sampling tokens.
    is_pooling_model: bool = False
    # A local Hugging Face-style directory (config.json + *.safetensors); None means random init.
    weights_path: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "max_model_len"):
            _require(getattr(self, name) >= 1, f"model.{name}", "must be >= 1")
        _require(self.num_heads % self.num_kv_heads == 0, "model.num_kv_heads",
                 f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                 f"({self.num_kv_heads}) for grouped-query attention")
        _require(self.head_dim % 2 == 0, "model.head_dim", "must be even for rotary embeddings")
        _require(self.architecture in ARCHITECTURES, "model.architecture",
                 f"{self.architecture!r} is not one of {', '.join(ARCHITECTURES)}")
        _require(self.sliding_window is None or self.sliding_window >= self.max_model_len,
                 "model.sliding_window",
                 f"sliding-window attention is not implemented: the window "
                 f"({self.sliding_window}) must be >= max_model_len ({self.max_model_len})")
        _require(self.rms_norm_eps > 0, "model.rms_norm_eps", "must be > 0")
        self._check_moe()
        check_fp8(self)

    def _check_moe(self) -> None:
        if not self.is_moe:
            _require(self.num_experts == 0 and self.num_experts_per_tok == 0
                     and self.moe_intermediate_size == 0, "model.num_experts",
                     f"must be 0: {self.architecture} is not a Mixture-of-Experts model")
            return
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            _require(getattr(self, name) >= 1, f"model.{name}",
                     f"must be >= 1 for {self.architecture}")
        _require(self.num_experts_per_tok <= self.num_experts, "model.num_experts_per_tok",
                 f"{self.num_experts_per_tok} exceeds num_experts ({self.num_experts})")
        _require(self.norm_topk_prob or self.architecture != "mixtral", "model.norm_topk_prob",
                 "mixtral always renormalises its top-k routing weights")

    @property
    def is_moe(self) -> bool:
        """Every layer's MLP is a routed Mixture of Experts (runner.moe)."""
        return self.architecture in MOE_ARCHITECTURES

    @property
    def qkv_bias(self) -> bool:
        """The q/k/v projections carry biases (Qwen2)."""
        return self.architecture == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """q and k are RMS-normalised per head before rotary (Qwen3)."""
        return self.architecture in ("qwen3", "qwen3_moe")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModelConfig:
        if name not in MODEL_PRESETS:
            raise ConfigError("model", f"unknown preset {name!r}; choose one of {preset_names()}")
        config = cls(name=name, **{**MODEL_PRESETS[name], **overrides})
        limit = PRESET_MAX_POSITIONS[name]
        _require(config.max_model_len <= limit, "model.max_model_len",
                 f"{config.max_model_len} exceeds preset {name}'s max_position_embeddings "
                 f"{limit}")
        return config


@dataclass(frozen=True)
class DeviceConfig:
    device: str = field(default="auto", metadata=flag("--device", "auto, cpu, cuda or cuda:N"))
    dtype: str = field(default="auto", metadata=flag(
        "--dtype", "auto, float32, bfloat16 or float16"))
    attention_backend: str = field(default="auto", metadata=flag(
        "--attention-backend", "auto, torch, triton or flashinfer",
        parse=flag_values.attention_backend))

    def __post_init__(self) -> None:
        _require(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
                 "device.device", f"{self.device!r} is not one of auto, cpu, cuda, cuda:N")
        _require(self.dtype in ("auto", "float32", "bfloat16", "float16"), "device.dtype",
                 f"{self.dtype!r} is not one of auto, float32, bfloat16, float16")


@dataclass(frozen=True)
class ParallelConfig:
    # Ranks the model is sharded over (Megatron tensor parallel, warmgate.server.distributed);
    # 1 is the single-process runner, unchanged.
    tensor_parallel_size: int = field(default=1, metadata=flag(
        "--tensor-parallel-size", "GPUs (CPU processes on a CPU device) the model is sharded "
        "over; the server starts a worker process per extra rank"))
    # This process's rank: 0 is the server, 1..N-1 the workers it starts. Part of the config
    # (and so of config_hash and the compile cache key): each rank compiles its own shard.
    rank: int = 0

    def __post_init__(self) -> None:
        _require(self.tensor_parallel_size >= 1, "parallel.tensor_parallel_size",
                 "must be >= 1")
        _require(0 <= self.rank < self.tensor_parallel_size, "parallel.rank",
                 f"must be between 0 and tensor_parallel_size - 1 "
                 f"({self.tensor_parallel_size - 1})")


@dataclass(frozen=True)
class RunnerConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    compilation: CompilationConfig = field(default_factory=CompilationConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)

    def __post_init__(self) -> None:
        _require(not self.model.is_moe or self.parallel.tensor_parallel_size == 1,
                 "parallel.tensor_parallel_size", f"{self.model.architecture} (Mixture of "
                 "Experts) runs on one GPU only: tensor parallel MoE is not implemented")
        _require(self.model.fp8 is None or self.parallel.tensor_parallel_size == 1,
                 "parallel.tensor_parallel_size", "FP8 weights run on one GPU only: tensor "
                 "parallel FP8 is not implemented")

    @property
    def decode_query_len(self) -> int:
        return 1 + self.speculative.num_speculative_steps

    @property
    def max_blocks_per_req(self) -> int:
        return cdiv(self.model.max_model_len, self.cache.block_size)

    @property
    def is_resolved(self) -> bool:
        return (self.device.device != "auto" and self.device.dtype != "auto"
                and self.device.attention_backend != "auto" and self.cache.num_blocks is not None
                and self.compilation.cuda_graph_sizes is not None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config_hash(self) -> str:
        """A stable digest of everything that shapes compiled code."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def resolve_runner_config(config: RunnerConfig, *, cuda_available: bool | None = None,
                          flashinfer_available: bool | None = None,
                          triton_available: bool | None = None,
                          cuda_capability: tuple[int, int] | None = None) -> RunnerConfig:
    """Resolve every "auto" into a concrete value. The only place that probes the machine."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    dev = config.device
    device = dev.device
    if device == "auto":
        device = "cuda" if cuda_available else "cpu"
    if device.startswith("cuda") and not cuda_available:
        raise ConfigError("device.device", f"{device!r} was asked for but CUDA is not available")
    on_cuda = device.startswith("cuda")
    if on_cuda and config.model.fp8 is not None:
        check_fp8_device(config.model.name, device, cuda_capability)
    dtype = dev.dtype if dev.dtype != "auto" else ("bfloat16" if on_cuda else "float32")
    backend = dev.attention_backend
    if backend == "auto":
        if flashinfer_available is None:
            flashinfer_available = on_cuda and backend_available("flashinfer")
        if triton_available is None:
            triton_available = on_cuda and backend_available("triton")
        if (on_cuda and flashinfer_available
                and head_dim_problem("flashinfer", config.model.head_dim) is None):
            backend = "flashinfer"
        elif on_cuda and triton_available:
            backend = "triton"
        else:
            backend = "torch"
    if config.compilation.pdl:
        check_pdl(device, backend, cuda_capability)
    num_blocks = config.cache.num_blocks
    if num_blocks is None:
        num_blocks = config.scheduler.max_num_seqs * config.max_blocks_per_req + 1
    sizes = config.compilation.cuda_graph_sizes
    if sizes is None:
        sizes = default_cuda_graph_sizes(config.scheduler.max_num_seqs)
    return check_deterministic(dataclasses.replace(
        config, cache=dataclasses.replace(config.cache, num_blocks=num_blocks),
        device=dataclasses.replace(dev, device=device, dtype=dtype, attention_backend=backend),
        compilation=dataclasses.replace(config.compilation, cuda_graph_sizes=tuple(sizes)),
    ))
