"""The ops object a runner's model calls, the sampler's warper ops and how its Triton kernels
launch (--pdl), from its configuration."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.runner.deterministic_ops import RowwiseTorchOps
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.sampling.warper_ops import (
    TORCH_WARPER_OPS,
    WarperOps,
    invariant_warper_ops,
)

logger = logging.getLogger(__name__)


def uses_triton_kernels(config: RunnerConfig) -> bool:
    """CUDA with a GPU attention backend: the runner's own ops are Triton kernels."""
    return (config.device.device.startswith("cuda")
            and config.device.attention_backend != "torch")


def default_ops(config: RunnerConfig) -> TorchOps:
    """Triton kernels for norms, activation and rotary on CUDA when a GPU backend is in use;
    torch everywhere else (the CPU path never imports triton). --deterministic: their
    batch-invariant forms (runner.deterministic_ops, kernels.invariant_ops)."""
    deterministic = config.numerics.deterministic
    if uses_triton_kernels(config):
        from warmgate.server.kernels.invariant_ops import BatchInvariantOps
        from warmgate.server.kernels.ops import TritonOps
        from warmgate.server.kernels.triton_key import start_triton_key

        start_triton_key()  # Triton's cache key, hashed while the weights load
        # Same methods as TorchOps.
        return BatchInvariantOps() if deterministic else TritonOps()  # type: ignore[return-value]
    return RowwiseTorchOps() if deterministic else TorchOps()


# The module owning the launch switch; importing it imports triton.
_PDL_MODULE = "warmgate.server.kernels.pdl"


def configure_pdl(config: RunnerConfig) -> None:
    """Set this process's programmatic-dependent-launch switch (kernels.pdl) from the runner
    being built: every process that runs a model (the engine, each tensor-parallel worker)
    builds its runner, so the switch follows its configuration there. resolve_runner_config
    has refused --pdl wherever it cannot run. Off is the kernels' default: with --pdl off, and
    triton not imported yet, nothing is imported (the CPU path never imports triton)."""
    on = config.compilation.pdl
    if not on and _PDL_MODULE not in sys.modules:
        return
    from warmgate.server.kernels.pdl import PDL_KERNELS, set_pdl

    set_pdl(on)
    if on:
        logger.info("pdl: on (--pdl): %d Triton launch sites launch with programmatic "
                    "dependent launch: %s", len(PDL_KERNELS), "; ".join(PDL_KERNELS))


def sampler_warper_ops(config: RunnerConfig) -> WarperOps:
    """The warpers' softmax, cumsum, top-k and argmax. Where the runner's ops are Triton
    kernels the argmax is the chunked kernel (kernels/row_argmax.py: the same indices as
    torch's, many times faster on a vocabulary's row). --deterministic there: the
    one-program-per-row kernels (kernels/row_reductions.py) and the top-k with ties in index
    order, so the sampled rows are drawn in one batch and each still gets its own bits.
    Everywhere else torch's: the default mode does not need invariance, and --deterministic
    on the CPU draws each sampled row alone (the CPU path never imports triton)."""
    if not uses_triton_kernels(config):
        if config.numerics.deterministic:
            logger.info("sampler: --deterministic on %s draws each sampled row alone (torch "
                        "softmax, top-k and cumsum, one row per call)", config.device.device)
        return TORCH_WARPER_OPS
    from warmgate.server.kernels.row_argmax import CHUNK, row_argmax

    logger.info("sampler: argmax by a Triton kernel over chunks of %d columns", CHUNK)
    if not config.numerics.deterministic:
        return replace(TORCH_WARPER_OPS, argmax=row_argmax, name="torch+triton-argmax")
    from warmgate.server.kernels.row_reductions import ROW_BLOCK, row_cumsum, row_softmax

    logger.info("sampler: --deterministic draws the sampled rows in one batch with per-row "
                "Triton softmax and cumsum (chunks of %d columns, one program per row) and "
                "top-k ties in index order", ROW_BLOCK)
    return invariant_warper_ops(row_softmax, row_cumsum, name="triton-per-row",
                                argmax=row_argmax)
