"""The expert shapes the fused MoE kernel (kernels.fused_moe) takes, checked before the load.

The kernel tiles an expert's gate/up and down GEMMs in blocks of at least MIN_BLOCK (tl.dot's
smallest tile) along N and K. The two widths it tiles, hidden_size and moe_intermediate_size,
are also the row strides of its operands: a width that is a multiple of MIN_BLOCK keeps every
row of every tile 16-element aligned, the case Triton specialises its loads for, and needs no
masked tail tile. Its launch grid is sized for the worst-case padding (every expert's run
padded to a whole BLOCK_M tile, num_experts * (BLOCK_M - 1) rows), so past MAX_EXPERTS a
decode step would launch mostly empty programs. On a CPU the torch reference runs instead,
which takes any shape, so the check applies where the kernel runs: on CUDA.

The launch configuration (BLOCK_M/N/K, warps, stages) depends on the token count: few tokens
leave most of an expert's tile empty (a small BLOCK_M wastes little), many fill large tiles.
LAUNCH_TABLE gives each token-count bucket a launch; `table_launch` fits it to the expert
shape (BLOCK_M no taller than the rows an expert expects at the bucket's top, T * top_k /
num_experts; BLOCK_N/K no wider than the GEMMs) and `candidates` are what an autotune times
(runner.moe_launches). Plain data here, so that the runner can pick launches without importing
the kernels (and triton) on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from warmgate.server.config.runner_config import ConfigError, ModelConfig

MIN_BLOCK = 16
MAX_EXPERTS = 512
# The gate/up GEMM keeps two float32 accumulators of BLOCK_M x BLOCK_N: past 128 x 128 they
# no longer fit the registers of 8 warps (255 per thread), so no candidate is larger.
MAX_TILE_ELEMENTS = 128 * 128


def check_moe_kernel_shape(model: ModelConfig) -> None:
    """Raise ConfigError naming the model field the fused MoE kernel cannot take."""
    if not model.is_moe:
        return
    if model.num_experts > MAX_EXPERTS:
        raise ConfigError("model.num_experts",
                          f"{model.num_experts} experts; the fused MoE kernel takes at most "
                          f"{MAX_EXPERTS}")
    for name in ("moe_intermediate_size", "hidden_size"):
        value = getattr(model, name)
        if value % MIN_BLOCK:
            raise ConfigError(f"model.{name}",
                              f"{value} is not a multiple of {MIN_BLOCK}, the fused MoE "
                              "kernel's smallest BLOCK_N/BLOCK_K")


@dataclass(frozen=True)
class MoELaunch:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return (f"M{self.block_m}xN{self.block_n}xK{self.block_k}/w{self.num_warps}"
                f"/s{self.num_stages}")


@dataclass(frozen=True)
class ExpertShape:
    """What a launch depends on besides the token count."""

    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int

    def key(self) -> str:
        return (f"e{self.num_experts}k{self.top_k}h{self.hidden_size}"
                f"i{self.intermediate_size}")


# (most tokens in the bucket, its launch). Small batches (decode) route few rows to each
# expert, so a small BLOCK_M wastes little padding; prefill-sized batches fill big tiles.
LAUNCH_TABLE: tuple[tuple[int, MoELaunch], ...] = (
    (32, MoELaunch(16, 64, 64, 4, 3)),
    (256, MoELaunch(32, 64, 64, 4, 3)),
    (2048, MoELaunch(64, 128, 64, 8, 3)),
    (2**62, MoELaunch(128, 128, 64, 8, 3)),
)


def token_buckets() -> tuple[int, ...]:
    """The bucket bounds, ascending."""
    return tuple(most for most, _ in LAUNCH_TABLE)


def bucket_of(num_tokens: int) -> int:
    """The bound of the smallest bucket that holds num_tokens."""
    return next(most for most in token_buckets() if num_tokens <= most)


def buckets_up_to(max_tokens: int) -> tuple[int, ...]:
    """Every bucket a forward of 1..max_tokens tokens lands in."""
    return tuple(b for b in token_buckets() if b <= bucket_of(max_tokens))


def launch_for(num_tokens: int) -> MoELaunch:
    """The table's launch for num_tokens, before fitting it to an expert shape."""
    return dict(LAUNCH_TABLE)[bucket_of(num_tokens)]


def _pow2_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _fit(launch: MoELaunch, shape: ExpertShape, bucket_top: int | None = None) -> MoELaunch:
    """BLOCK_N/K no wider than the GEMMs; with bucket_top, BLOCK_M no taller than the rows an
    expert expects there (the rest of a taller tile would be padding)."""
    width = _pow2_at_most(min(shape.hidden_size, shape.intermediate_size))
    block_m = launch.block_m
    if bucket_top is not None:
        block_m = min(block_m, _pow2_at_least(-(-bucket_top * shape.top_k // shape.num_experts)))
    return replace(launch, block_m=max(MIN_BLOCK, block_m),
                   block_n=max(MIN_BLOCK, min(launch.block_n, width)),
                   block_k=max(MIN_BLOCK, min(launch.block_k, width)))


def table_launch(bucket: int, shape: ExpertShape, max_tokens: int | None = None) -> MoELaunch:
    """The table's launch for `bucket`, fitted to the expert shape; `max_tokens` caps the
    bucket's top (the last bucket is open-ended)."""
    top = bucket if max_tokens is None else min(bucket, max_tokens)
    return _fit(dict(LAUNCH_TABLE)[bucket], shape, top)


def candidates(bucket: int, shape: ExpertShape, max_tokens: int | None = None
               ) -> list[MoELaunch]:
    """The few launches an autotune times for a bucket: the table's first, then twice and
    half its BLOCK_M, a wider BLOCK_N, the other warp count and one stage less (each no
    wider than the GEMMs); no duplicates."""
    base = table_launch(bucket, shape, max_tokens)
    variants = [replace(base, block_m=base.block_m * 2), replace(base, block_m=base.block_m // 2),
                replace(base, block_n=base.block_n * 2),
                replace(base, num_warps=4 if base.num_warps == 8 else 8),
                replace(base, num_stages=max(1, base.num_stages - 1))]
    out = [base]
    for v in variants:
        fitted = _fit(v, shape)
        if fitted not in out and fitted.block_m * fitted.block_n <= MAX_TILE_ELEMENTS:
            out.append(fitted)
    return out
