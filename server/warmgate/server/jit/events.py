"""What the JIT observers report: one event per compile (or cache load), tagged with the batch
that was in flight and whether health was already SERVING."""

from __future__ import annotations

from dataclasses import dataclass

# Event kinds. The first four are compilers (autotune, below, runs one); a CUDA-graph miss
# compiles nothing but is the same kind of first-use surprise (a uniform decode that found no
# captured graph ran eagerly).
TRITON = "triton"
FLASHINFER = "flashinfer"
DYNAMO = "dynamo"
INDUCTOR = "inductor"
CUDA_GRAPH_MISS = "cuda_graph_miss"
# Tensor parallel: the first use of a collective (op, dtype, group) on a rank, the moment NCCL
# (or gloo) sets up that communicator's channels and buffers; the distributed warmup phase
# makes every one the model uses, so one after ready is a set-up a request paid for.
COMMUNICATOR_SETUP = "communicator_setup"
# The fused MoE kernel timing its candidate launches for a token-count bucket (and compiling
# each): the warmup's moe phase does it for every bucket a forward can reach, so one after ready
# is a request paying for it. Counted and exported like a compile.
AUTOTUNE = "autotune"
COMPILE_KINDS = (TRITON, FLASHINFER, DYNAMO, INDUCTOR, AUTOTUNE)
KINDS = (*COMPILE_KINDS, CUDA_GRAPH_MISS, COMMUNICATOR_SETUP)
# Kinds whose builds persist in an on-disk cache, so a first use is a hit or a miss.
CACHED_KINDS = (TRITON, FLASHINFER, INDUCTOR)


@dataclass(frozen=True)
class BatchShape:
    """The step the runner had in flight: what caused a compile, for the log line."""

    kind: str  # uniform_decode | prefill | mixed (runner.batch.BatchKind values)
    num_reqs: int
    num_tokens: int
    max_query_len: int

    def __str__(self) -> str:
        return (f"{self.kind} batch num_reqs={self.num_reqs} num_tokens={self.num_tokens} "
                f"max_query_len={self.max_query_len}")


@dataclass(frozen=True)
class JitEvent:
    kind: str
    # True: the code was generated/compiled now (a cache miss). False: an existing build was
    # loaded from a compile cache (a hit) - first use in this process, but no compiler ran.
    compiled: bool
    after_ready: bool
    # What was compiled: a Triton kernel, a FlashInfer module, a dynamo frame "name 0/3".
    name: str
    batch: BatchShape | None = None
    seconds: float = 0.0
    # The tensor-parallel rank it happened on (0: the server process; always 0 at TP=1).
    rank: int = 0

    @property
    def is_compile(self) -> bool:
        """A compiler ran (what strict mode acts on); cache loads and graph misses do not."""
        return self.compiled and self.kind in COMPILE_KINDS

    def describe(self) -> str:
        what = "compiled" if self.compiled else "loaded from cache"
        if self.kind == CUDA_GRAPH_MISS:
            what = "ran eagerly (no captured CUDA graph fits)"
        elif self.kind == COMMUNICATOR_SETUP:
            what = "set up (first use of this collective)"
        cause = str(self.batch) if self.batch is not None else "no batch in flight"
        where = f" on rank {self.rank}" if self.rank else ""
        return (f"{self.kind} {self.name} {what}{where} in {self.seconds:.3f} s, "
                f"caused by {cause}")
