"""Warmup outcomes as data: a skip is a returned value, never an exception."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class PhaseStatus(enum.Enum):
    RAN = "RAN"
    SKIPPED = "SKIPPED"
    FAILED = "FAILED"


class SkipReason(enum.Enum):
    POOLING_MODEL = "POOLING_MODEL"
    MAX_NUM_REQS_LT_2 = "MAX_NUM_REQS_LT_2"
    NUM_TOKENS_LT_3 = "NUM_TOKENS_LT_3"
    INSUFFICIENT_KV_BLOCKS = "INSUFFICIENT_KV_BLOCKS"
    NO_CUDA = "NO_CUDA"
    BACKEND_NOT_SELECTED = "BACKEND_NOT_SELECTED"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    UNSUPPORTED_DEVICE = "UNSUPPORTED_DEVICE"
    NO_CAPTURE_SIZES = "NO_CAPTURE_SIZES"
    DISABLED = "DISABLED"
    # The token budget (max_num_batched_tokens) cannot hold the warmup's batch.
    TOKEN_BUDGET_TOO_SMALL = "TOKEN_BUDGET_TOO_SMALL"
    # An earlier phase failed, so the plan stopped before this one.
    EARLIER_PHASE_FAILED = "EARLIER_PHASE_FAILED"
    # Graphs were captured by an earlier plan and `force` was not set.
    ALREADY_CAPTURED = "ALREADY_CAPTURED"
    # max_model_len cannot hold one warmup request (its prefill and first decode).
    MAX_MODEL_LEN_TOO_SMALL = "MAX_MODEL_LEN_TOO_SMALL"
    # No tokenizer.json (or no EOS ids): no request can carry a grammar.
    NO_TOKENIZER = "NO_TOKENIZER"
    # A dense model: no Mixture-of-Experts layers, no fused MoE kernel to warm.
    NOT_MOE = "NOT_MOE"
    # The weights are not FP8: no FP8 GEMM to warm.
    NOT_FP8 = "NOT_FP8"
    # --deterministic is off: the determinism check has nothing to prove.
    NOT_DETERMINISTIC = "NOT_DETERMINISTIC"


@dataclass
class PhaseResult:
    name: str
    status: PhaseStatus
    duration_s: float = 0.0
    skip_reason: SkipReason | None = None
    # A sentence: why it skipped, what failed and which setting to change, or what ran.
    detail: str = ""
    num_reqs: int = 0
    num_tokens: int = 0
    # Steps (execute_model + sample_tokens pairs, or graph captures) the phase ran.
    num_steps: int = 0
    # Shapes used, for the report: e.g. {"prompt_len": 3, "decode_query_len": 2}.
    shapes: dict[str, Any] = field(default_factory=dict)
    # JIT compiles observed during the phase, by kind (triton, flashinfer, dynamo, ...).
    compiles: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0

    @property
    def ok(self) -> bool:
        return self.status is not PhaseStatus.FAILED

    @classmethod
    def skipped(cls, name: str, reason: SkipReason, detail: str) -> PhaseResult:
        return cls(name=name, status=PhaseStatus.SKIPPED, skip_reason=reason, detail=detail)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        out["skip_reason"] = self.skip_reason.value if self.skip_reason else None
        return out


@dataclass
class WarmupResult:
    """What `warmup_kernels` and `run_mixed_prefill_decode_warmup` return.

    Truthy iff the warmup ran, so vLLM-style `if run_mixed_prefill_decode_warmup(...):` works.
    """

    ran: bool
    phases: list[PhaseResult] = field(default_factory=list)
    skip_reason: SkipReason | None = None
    detail: str = ""

    def __bool__(self) -> bool:
        return self.ran

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    @classmethod
    def skipped(cls, name: str, reason: SkipReason, detail: str) -> WarmupResult:
        return cls(ran=False, phases=[PhaseResult.skipped(name, reason, detail)],
                   skip_reason=reason, detail=detail)


class WarmupOutcome(enum.Enum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass
class WarmupReport:
    """The whole plan's result: every phase in order, and the overall outcome."""

    outcome: WarmupOutcome
    phases: list[PhaseResult]
    total_duration_s: float
    config_hash: str
    device: str = ""
    attention_backend: str = ""
    model: str = ""
    # The --cache-dir entry (warmgate.server.cache.CacheInfo.to_dict()); None without one.
    compile_cache: dict[str, Any] | None = None
    # The runner runs --deterministic (batch-invariant kernels).
    deterministic: bool = False

    @property
    def succeeded(self) -> bool:
        return self.outcome is WarmupOutcome.SUCCEEDED

    def phase(self, name: str) -> PhaseResult:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "phases": [p.to_dict() for p in self.phases],
            "total_duration_s": self.total_duration_s,
            "config_hash": self.config_hash,
            "device": self.device,
            "attention_backend": self.attention_backend,
            "model": self.model,
            "compile_cache": self.compile_cache,
            "deterministic": self.deterministic,
        }
