"""The `moe` phase: a launch for every token-count bucket of the fused MoE kernel a forward can
reach (1..the token budget), then one run of a MoE layer per bucket, so the kernel each bucket
launches is compiled before any other phase (or a request) runs a forward.

Where the launches come from: the compile cache entry when it holds them for this GPU,
libraries and expert shape (a warm start times nothing); else, on CUDA, an autotune per bucket
(runner.moe_launches: a few candidates timed on the device), its winners then kept in the entry;
on a CPU, where the torch reference runs and nothing can be timed, the table. The phase reports
the autotune and compile seconds apart. A dense model skips it (NOT_MOE).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from warmgate.server.cache.moe_launches import load_moe_launches, save_moe_launches
from warmgate.server.cache.shape_sweeps import kernel_map_dir
from warmgate.server.config.moe_kernel import MoELaunch, buckets_up_to
from warmgate.server.core.phases import MOE
from warmgate.server.core.progress import PhaseProgress, ProgressCallback
from warmgate.server.core.results import PhaseResult, PhaseStatus, SkipReason
from warmgate.server.runner.moe import MoEBlock
from warmgate.server.runner.moe_launches import MoELaunches
from warmgate.server.warmup.kernel_probe import kernel_identity
from warmgate.server.warmup.runner_contract import WarmupRunner
from warmgate.server.warmup.steps import synced_timer

logger = logging.getLogger(__name__)


def bucket_token_counts(max_tokens: int) -> dict[int, int]:
    """{bucket: the token count the phase runs it at}: its top, or the budget in the last."""
    return {b: min(b, max_tokens) for b in buckets_up_to(max_tokens)}


def run_moe_warmup(runner: WarmupRunner, *, progress: ProgressCallback | None = None,
                   kernel_dir: Path | None = None) -> PhaseResult:
    """`kernel_dir`: where the entry keeps the launches (default: the compile cache's)."""
    # A tensor-parallel runner (dense only: TP MoE is refused at start-up) holds no model here.
    launches: MoELaunches | None = getattr(getattr(runner, "model", None), "moe_launches", None)
    if launches is None:
        return PhaseResult.skipped(MOE, SkipReason.NOT_MOE,
                                   "a dense model: no Mixture-of-Experts layers")
    kernel_dir = kernel_map_dir() if kernel_dir is None else kernel_dir
    counts = bucket_token_counts(runner.max_num_tokens)
    tracker = PhaseProgress(MOE, 2 * len(counts), progress)
    source, why = _choose(runner, launches, counts, kernel_dir, tracker)
    with synced_timer(runner) as compile_t:
        for tokens in counts.values():
            _run_layer(runner, tokens)  # the bucket's launch, as a forward would take it
            tracker.step()
    autotune_s = sum(launches.tuned_seconds.get(b, 0.0) for b in counts)
    chosen = {str(b): str(launches.chosen[b]) for b in counts}
    logger.info("moe phase: %d buckets %s, launches from %s (%s): autotune %.3f s, compile "
                "%.3f s; %s", len(counts), list(counts), source, why or "-", autotune_s,
                compile_t[0], chosen)
    return PhaseResult(
        name=MOE, status=PhaseStatus.RAN, duration_s=autotune_s + compile_t[0],
        num_tokens=max(counts.values()), num_steps=len(counts),
        shapes={"buckets": list(counts), "token_counts": list(counts.values()),
                "launches": chosen, "source": source, "expert_shape": launches.shape.key(),
                "autotune_s": round(autotune_s, 4), "compile_s": round(compile_t[0], 4)},
        detail=f"fused MoE launches for {len(counts)} token-count buckets from {source}"
               f"{f' ({why})' if why else ''}; autotune {autotune_s:.3f} s, one MoE layer "
               f"per bucket {compile_t[0]:.3f} s")


def _choose(runner: WarmupRunner, launches: MoELaunches, counts: dict[int, int],
            kernel_dir: Path | None, tracker: PhaseProgress) -> tuple[str, str]:
    """Fill every bucket's launch; returns (where they came from, why not from the cache)."""
    buckets = list(counts)
    if all(b in launches.chosen for b in buckets):
        _steps(tracker, len(buckets))
        return "an earlier plan", ""
    if launches.timer is None:
        for tokens in counts.values():
            launches.launch(tokens)
            tracker.step()
        return "the table", "nothing to time on this device"
    identity = kernel_identity(runner.device)
    why = "no compile cache (--cache-dir) to keep them in"
    if kernel_dir is not None:
        kept, why = load_moe_launches(kernel_dir, identity, launches.shape.key(), buckets)
        if kept is not None:
            launches.preset({b: MoELaunch(*kept[b]) for b in buckets})
            _steps(tracker, len(buckets))
            return "the compile cache", ""
    for bucket, tokens in counts.items():
        if bucket not in launches.chosen:
            launches.tune(bucket, tokens)
        tracker.step()
    if kernel_dir is not None:
        stored = {b: (launches.chosen[b].block_m, launches.chosen[b].block_n,
                      launches.chosen[b].block_k, launches.chosen[b].num_warps,
                      launches.chosen[b].num_stages) for b in buckets}
        try:
            path = save_moe_launches(kernel_dir, identity, launches.shape.key(), stored)
            logger.info("moe phase: autotuned launches kept in %s", path)
        except OSError as exc:  # a read-only or full cache volume costs the next start only
            logger.warning("moe phase: autotuned launches not kept (%s: %s): the next start "
                           "tunes again", type(exc).__name__, exc)
    return "autotune", why


def _steps(tracker: PhaseProgress, count: int) -> None:
    for _ in range(count):
        tracker.step()


@torch.inference_mode()
def _run_layer(runner: WarmupRunner, num_tokens: int) -> None:
    """The first MoE layer's experts at num_tokens tokens (every layer has its shape, so its
    kernels are theirs), routed by the layer's router over random hidden states."""
    moe = next(m for m in (getattr(layer, "moe", None) for layer in runner.model.layers)
               if isinstance(m, MoEBlock))
    gen = torch.Generator(device=runner.device).manual_seed(num_tokens)
    hidden = torch.randn(num_tokens, moe.w13.shape[2], generator=gen, device=runner.device,
                         dtype=moe.router.dtype)  # the served dtype (FP8 experts: not w13's)
    moe(hidden)


def sweep_moe_tokens(runner: WarmupRunner) -> int:
    """The compile phase's MoE sweep (CUDA, --shape-sweeps): a MoE layer at every token count
    a forward can run outside a CUDA graph after ready, so the routing's sort and scans load
    their size-specific kernels now, each at the launch of its bucket (the moe phase chose
    them all). Returns the calls made (0 for a dense model)."""
    if getattr(getattr(runner, "model", None), "moe_launches", None) is None:
        return 0
    counts = runner.eager_token_counts()
    start = time.perf_counter()
    for n in counts:
        _run_layer(runner, n)
    logger.info("shape sweeps: MoE layer at %d token counts (%s..%s) in %.3f s", len(counts),
                counts[0] if counts else "-", counts[-1] if counts else "-",
                time.perf_counter() - start)
    return len(counts)
