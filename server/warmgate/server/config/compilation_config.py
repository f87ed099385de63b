"""How the runner compiles and launches: CUDA graphs, torch.compile, the warmup's shape
sweeps, programmatic dependent launch."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmgate.server.config.config_error import _require
from warmgate.server.config.flags import flag


@dataclass(frozen=True)
class CompilationConfig:
    # Uniform-decode batch sizes (in requests) to capture CUDA graphs for; None means auto.
    cuda_graph_sizes: tuple[int, ...] | None = None
    enable_cuda_graphs: bool = field(default=True, metadata=flag(
        "--cuda-graphs", "capture uniform-decode CUDA graphs"))
    # An eager prefill is host-bound (runner.cuda_graphs), hence graphs for ragged batches.
    ragged_cuda_graphs: bool = field(default=True, metadata=flag(
        "--ragged-cuda-graphs", "with --cuda-graphs, also capture prefill and mixed batches, "
        "one graph per token bucket (triton backend; others run them eagerly)"))
    # Attention stays eager (runner.compile_buckets). Off by default: compiling costs start-up.
    compile: bool = field(default=False, metadata=flag(
        "--compile", "torch.compile the model's dense layers, one graph per token bucket, all "
        "compiled by the warmup's compile phase"))
    # So cuBLAS picks its algorithms and size-specific kernels load before ready
    # (warmup.gemm_shapes, warmup.sampler_rows).
    shape_sweeps: bool = field(default=True, metadata=flag(
        "--shape-sweeps", "on CUDA, run every dense GEMM shape a forward can meet outside a "
        "CUDA graph (its eager token counts, the head's logits rows) and the sampler at every "
        "batch size before ready, so no first batch of a new size waits for cuBLAS or kernel "
        "loading"))
    # Decode-sized GEMMs are reads of the weight; cuBLAS's tiles for them fall short of the
    # bandwidth on some shapes (kernels/dense_gemv.py, runner/linear_tuning.py).
    dense_gemv: bool = field(default=True, metadata=flag(
        "--dense-gemv", "on CUDA, time a Triton GEMV against cuBLAS for every dense projection "
        "and the head at 1-16 tokens during the warmup, and run the faster of the two for "
        "each (shape, token count)"))
    # A decode step is hundreds of short launches with a gap of launch latency before each
    # (kernels/pdl.py). Off until a GPU run shows it faster and bit-identical.
    pdl: bool = field(default=False, metadata=flag(
        "--pdl", "launch the decode step's Triton kernels (the GEMVs, RMSNorm, rotary and KV "
        "write, decode attention, SiLU-and-mul, the MoE routing and per-slot experts) with "
        "programmatic dependent launch, so each one's launch and prologue overlap the tail "
        "of the kernel before it; needs an sm_90+ GPU (compute capability 9.0, Hopper, or "
        "newer) and the Triton attention and ops (--attention-backend triton or "
        "flashinfer)"))

    def __post_init__(self) -> None:
        if self.cuda_graph_sizes is not None:
            _require(all(s >= 1 for s in self.cuda_graph_sizes), "compilation.cuda_graph_sizes",
                     "every size must be >= 1")


def default_cuda_graph_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8 up to max_num_seqs (vLLM's default pattern)."""
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs]
    sizes += list(range(8, max_num_seqs + 1, 8))
    if max_num_seqs not in sizes:
        sizes.append(max_num_seqs)
    return tuple(sorted(set(sizes)))
