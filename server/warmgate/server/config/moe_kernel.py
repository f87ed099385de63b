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

The first bucket, forwards of at most GEMV_MAX_TOKENS tokens (decode steps of a few streams),
takes the per-slot path instead (kernels.moe_gemv): a launch whose BLOCK_M is GEMV_BLOCK_M, one
(token, slot) row per program, needs no alignment by expert and runs two GEMV-style kernels
where the grouped path runs an alignment, two grid-padded GEMMs and a slot sum. Its BLOCK_N is
the gate/up kernel's N tile, BLOCK_K the K tile of both; every launch the table or an autotune
gives a bucket is a pure function of the token count, so a CUDA graph captured per batch size
holds one path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from warmgate.server.config.runner_config import ConfigError, ModelConfig

MIN_BLOCK = 16
MAX_EXPERTS = 512
# The gate/up GEMM keeps two float32 accumulators of BLOCK_M x BLOCK_N: past 128 x 128 they
# no longer fit the registers of 8 warps (255 per thread), so no candidate is larger.
MAX_TILE_ELEMENTS = 128 * 128
# The per-slot path's launches are marked by this BLOCK_M (a program's one row).
GEMV_BLOCK_M = 1
# Forwards of up to this many tokens (decode batches of one or two streams; T * top_k rows)
# take the per-slot path: there every row meets its expert alone and the grouped path's row
# tiles are nearly all padding; past it tokens share experts more and more, which the
# per-slot path reads once per row, the grouped path once per tile. On an H100
# (bench/results/h100-moe-decode-paths.txt, Qwen3-30B-A3B, CUDA graphs) the per-slot path
# took 4.53 ms a step at batch 1 against the grouped 5.17, and 8.50 against 6.69 at batch 8,
# where the bucket's eager autotune had picked it. bench/lib/decode_latency.py --grouped-moe
# times both paths.
GEMV_MAX_TOKENS = 2
# Its gate/up kernel keeps two float32 accumulators of BLOCK_N x BLOCK_K over its threads: at
# most this many elements of each a thread (about 120 registers in all on sm_90, no spills;
# twice as many took 239-255), so no candidate is larger.
GEMV_ELEMENTS_PER_THREAD = 32
# Its narrowest N tile, where the autotune's halving of the table's stops.
GEMV_MIN_BLOCK_N = 8


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

    @property
    def per_slot(self) -> bool:
        """Whether this is the per-slot (GEMV) path's launch, not the grouped GEMMs'."""
        return self.block_m == GEMV_BLOCK_M

    def __str__(self) -> str:
        if self.per_slot:
            return f"per-slot N{self.block_n}xK{self.block_k}/w{self.num_warps}"
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
    # The per-slot kernels' fastest on an H100 (bench/results/h100-launch-sweep.txt: 32.3 us
    # a Qwen3-30B-A3B layer at one token, the former N16/K256 here 49.1 on 4 warps).
    (GEMV_MAX_TOKENS, MoELaunch(GEMV_BLOCK_M, 8, 128, 4, 1)),
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
    expert expects there (the rest of a taller tile would be padding). A per-slot launch keeps
    its one row and may take N tiles narrower than tl.dot's (it has no dot)."""
    width = _pow2_at_most(min(shape.hidden_size, shape.intermediate_size))
    block_k = max(MIN_BLOCK, min(launch.block_k, width))
    if launch.per_slot:
        return replace(launch, block_n=max(GEMV_MIN_BLOCK_N, min(launch.block_n, width)),
                       block_k=block_k)
    block_m = launch.block_m
    if bucket_top is not None:
        block_m = min(block_m, _pow2_at_least(-(-bucket_top * shape.top_k // shape.num_experts)))
    return replace(launch, block_m=max(MIN_BLOCK, block_m),
                   block_n=max(MIN_BLOCK, min(launch.block_n, width)), block_k=block_k)


def table_launch(bucket: int, shape: ExpertShape, max_tokens: int | None = None) -> MoELaunch:
    """The table's launch for `bucket`, fitted to the expert shape; `max_tokens` caps the
    bucket's top (the last bucket is open-ended)."""
    top = bucket if max_tokens is None else min(bucket, max_tokens)
    return _fit(dict(LAUNCH_TABLE)[bucket], shape, top)


def grouped_launch(bucket: int, shape: ExpertShape, max_tokens: int | None = None
                   ) -> MoELaunch:
    """The grouped GEMMs' launch for `bucket`: the table's, or for a per-slot bucket the first
    grouped bucket's launch fitted to this bucket's top (what the per-slot path replaced)."""
    top = bucket if max_tokens is None else min(bucket, max_tokens)
    launch = next(launch for most, launch in LAUNCH_TABLE
                  if most >= bucket and not launch.per_slot)
    return _fit(launch, shape, top)


def fits_registers(launch: MoELaunch) -> bool:
    """Whether the launch's float32 accumulators fit the registers (no spills)."""
    if launch.per_slot:
        threads = 32 * launch.num_warps
        return launch.block_n * launch.block_k <= GEMV_ELEMENTS_PER_THREAD * threads
    return launch.block_m * launch.block_n <= MAX_TILE_ELEMENTS


def candidates(bucket: int, shape: ExpertShape, max_tokens: int | None = None
               ) -> list[MoELaunch]:
    """The few launches an autotune times for a bucket: the table's first, then twice and
    half its BLOCK_M, a wider BLOCK_N, the other warp count and one stage less (each no
    wider than the GEMMs); no duplicates. A per-slot bucket's: the table's, half its
    BLOCK_N, the other warp count, twice its BLOCK_N, BLOCK_K or both on 8 warps (stages
    change nothing there: its loads are not pipelined), then the grouped GEMMs' launch (so a
    GPU where they are faster keeps them)."""
    base = table_launch(bucket, shape, max_tokens)
    if base.per_slot:
        variants = [replace(base, block_n=base.block_n // 2),
                    replace(base, num_warps=4 if base.num_warps == 8 else 8),
                    replace(base, block_n=base.block_n * 2, num_warps=8),
                    replace(base, block_k=base.block_k * 2, num_warps=8),
                    replace(base, block_n=base.block_n * 2, block_k=base.block_k * 2,
                            num_warps=8),
                    grouped_launch(bucket, shape, max_tokens)]
    else:
        variants = [replace(base, block_m=base.block_m * 2),
                    replace(base, block_m=base.block_m // 2),
                    replace(base, block_n=base.block_n * 2),
                    replace(base, num_warps=4 if base.num_warps == 8 else 8),
                    replace(base, num_stages=max(1, base.num_stages - 1))]
    out = [base]
    for v in variants:
        fitted = _fit(v, shape)
        if fitted not in out and fits_registers(fitted):
            out.append(fitted)
    return out
