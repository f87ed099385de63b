"""How the runner computes, where more than one way gives different bits: `--deterministic`.

Off (the default), every op takes the fastest kernel for its shape, so a row's rounding can
depend on how many other rows share its step. On, every reduction a token's output depends on
(RMSNorm, the matmuls, attention, log-softmax, the sampler's probabilities) runs in an order
fixed by the model's widths and the token's own position only (runner.deterministic), so a
request gets the same tokens and logprobs alone and inside any batch. It changes the math,
so it lives in the runner config (config_hash, the compile cache key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from warmgate.server.config.compilation_config import CompilationConfig
from warmgate.server.config.config_error import _require
from warmgate.server.config.flags import flag


@dataclass(frozen=True)
class NumericsConfig:
    deterministic: bool = field(default=False, metadata=flag(
        "--deterministic", "batch-invariant kernels everywhere: a request's tokens and "
        "logprobs do not depend on the other requests in its batch, on how its prompt was "
        "chunked or on how many drafts were accepted (slower; README 'Deterministic mode')"))


class _Device(Protocol):
    @property
    def device(self) -> str: ...
    @property
    def attention_backend(self) -> str: ...


class _Model(Protocol):
    @property
    def is_moe(self) -> bool: ...
    @property
    def fp8(self) -> object | None: ...


class _Parallel(Protocol):
    @property
    def tensor_parallel_size(self) -> int: ...


class _Runner(Protocol):
    """What the check reads of a RunnerConfig (runner_config imports this module)."""

    @property
    def numerics(self) -> NumericsConfig: ...
    @property
    def compilation(self) -> CompilationConfig: ...
    @property
    def device(self) -> _Device: ...
    @property
    def model(self) -> _Model: ...
    @property
    def parallel(self) -> _Parallel: ...


R = TypeVar("R", bound=_Runner)


def check_deterministic(config: R) -> R:
    """`config` (resolved), unless --deterministic is on in a combination where it cannot
    keep its promise."""
    if not config.numerics.deterministic:
        return config
    # Inductor writes its own GEMM and reduction kernels, chosen per token bucket.
    _require(not config.compilation.compile, "compilation.compile",
             "--compile does not combine with --deterministic: inductor generates its own "
             "matmul and reduction kernels per token bucket")
    # The torch backend's graph-capturable decode path is one batched softmax over the batch.
    # An all-reduce's chunking, and so its summation order, follows the message size.
    _require(config.parallel.tensor_parallel_size == 1, "parallel.tensor_parallel_size",
             "--deterministic runs on one device: a tensor-parallel all-reduce sums in an "
             "order that follows the step's token count")
    # The FP8 GEMMs (_scaled_mm, the block kernel) choose their kernels per token count.
    _require(config.model.fp8 is None, "model", "--deterministic does not cover FP8 "
             "checkpoints: their GEMMs choose a kernel per token count")
    # The fused MoE kernel picks its launch per token-count bucket (only the CPU's torch
    # path runs its experts one token at a time).
    _require(config.device.device == "cpu" or not config.model.is_moe, "model",
             "--deterministic on CUDA does not cover Mixture-of-Experts models: the fused "
             "MoE kernel picks its launch per token count")
    _require(config.device.device == "cpu" or config.device.attention_backend != "torch",
             "device.attention_backend", "--deterministic on CUDA needs the triton or "
             "flashinfer attention backend (both then run the Triton varlen kernel)")
    return config
