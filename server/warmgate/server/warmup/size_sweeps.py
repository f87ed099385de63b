"""Run a family of size sweeps once each: every size, or only the sizes a kernel map keeps.

A size sweep calls one operation at sizes 1..N (sampler_rows: a sampling variant at every batch
size; gemm_shapes builds its GEMM calls the same way but runs them all, since cuBLAS chooses per
shape). With a compile cache, the first start runs every size under the probe
(kernel_probe.py), keeps in the entry the sizes where a kernel launches for the first time (and
the largest), and later starts run only those; cache/shape_sweeps.py says when a kept map is
not trusted (another GPU or library, a sweep it lacks), and then every size runs again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from warmgate.server.cache.shape_sweeps import KernelMap, load_kernel_map, save_kernel_map
from warmgate.server.core.failures import is_fatal_device_error, is_out_of_memory
from warmgate.server.warmup.kernel_probe import (
    ProbeError,
    covering_sizes,
    kernel_identity,
    profile_calls,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SizeSweep:
    # The kernel map's name for it: what it runs, and its sizes (1..max_size).
    key: str
    max_size: int
    # One call at a size in 1..max_size.
    call: Callable[[int], object]
    device: torch.device


# What a probe returns: for sizes 1..max_size, the kernels (names) that size launched.
KernelProbe = Callable[[SizeSweep], list[tuple[str, ...]]]


def profile_sweep(sweep: SizeSweep) -> list[tuple[str, ...]]:
    """The default probe: the profiler (kernel_probe.profile_calls)."""
    return profile_calls(sweep.call, sweep.max_size, sweep.device)


def sizes_to_keep(signatures: Sequence[tuple[str, ...]]) -> list[int]:
    """What a kernel map keeps of a sweep whose sizes 1..len(signatures) launched these
    kernels: the sizes that cover every kernel, and the largest size too: its temporaries are
    the biggest the allocator must hold, so no first batch of that size grows the cache
    (cudaMalloc) where the sweep did not."""
    return sorted({*covering_sizes(signatures), len(signatures)})


def _run(sweep: SizeSweep, sizes: Sequence[int]) -> int:
    for m in sizes:
        sweep.call(m)
    return len(sizes)


@dataclass
class _Learning:
    """The map a full sweep is learning, until a probe fails (then nothing is kept)."""
    sizes: dict[str, list[int]]
    failed: bool = False


def run_size_sweeps(sweeps: Sequence[SizeSweep], *, what: str, file_name: str,
                    kernel_dir: Path | None = None, probe: KernelProbe | None = None) -> int:
    """Each sweep once: with a kernel map in kernel_dir/file_name learned on this GPU and these
    libraries, only the sizes it keeps; without one, every size, under `probe` (default: the
    profiler) when there is a kernel_dir to keep the learned map in. `what` names the family in
    the log line. Returns the number of calls made."""
    start = time.perf_counter()
    keys = [s.key for s in sweeps]
    total = sum(s.max_size for s in sweeps)
    kept: KernelMap | None = None
    why = "no compile cache (--cache-dir) to keep a kernel map in"
    identity: dict[str, str] = {}
    if kernel_dir is not None and sweeps:
        identity = kernel_identity(sweeps[0].device)
        kept, why = load_kernel_map(kernel_dir, file_name, identity, keys)
    learning = _Learning({}) if kernel_dir is not None and kept is None else None
    count = 0
    for sweep in sweeps:
        if kept is not None:
            count += _run(sweep, kept.sizes[sweep.key])
        elif learning is not None and not learning.failed:
            count += _learn(sweep, probe or profile_sweep, learning)
        else:
            count += _run(sweep, range(1, sweep.max_size + 1))
    seconds = time.perf_counter() - start
    if kept is not None:
        logger.info("shape sweeps: %s: %d of %d sizes, every kernel of %d sweeps, in "
                    "%.3f s (kernel map in %s)", what, count, total, len(sweeps), seconds,
                    kernel_dir / file_name if kernel_dir else "-")
    elif learning is not None and not learning.failed and kernel_dir is not None:
        learned = sum(map(len, learning.sizes.values()))
        try:
            path = save_kernel_map(kernel_dir, file_name, KernelMap(identity, learning.sizes))
            where = f"kept in {path}"
        except OSError as exc:  # a read-only or full cache volume costs the next start only
            where = f"not kept ({type(exc).__name__}: {exc}): the next start sweeps every size"
        logger.info("shape sweeps: %s: every size, %d in %.3f s (%s); learned %d that launch "
                    "every kernel, %s", what, count, seconds, why, learned, where)
    else:
        logger.info("shape sweeps: %s: every size, %d in %.3f s (%s)", what, count, seconds,
                    why)
    return count


def will_learn(sweeps: Sequence[SizeSweep], *, file_name: str,
               kernel_dir: Path | None) -> bool:
    """Whether run_size_sweeps will learn a map (no usable one kept in kernel_dir)."""
    if kernel_dir is None or not sweeps:
        return False
    kept, _ = load_kernel_map(kernel_dir, file_name, kernel_identity(sweeps[0].device),
                              [s.key for s in sweeps])
    return kept is None


def _learn(sweep: SizeSweep, probe: KernelProbe, learning: _Learning) -> int:
    """Every size of one sweep under the probe, the sizes it keeps added to the map; if the
    probe fails, every size again without it and the map is dropped."""
    try:
        signatures = probe(sweep)
        if len(signatures) != sweep.max_size:
            raise ProbeError(f"the probe gave {len(signatures)} sizes of {sweep.max_size}")
        learning.sizes[sweep.key] = sizes_to_keep(signatures)
        return sweep.max_size
    except RuntimeError as exc:  # ProbeError, or the profiler's own failures
        if is_fatal_device_error(exc) or is_out_of_memory(exc):
            raise  # the device's failure, not the probe's: the phase reports it
        # Whether the probe's calls ran is unknown: run them plainly; learn nothing.
        logger.info("shape sweeps: kernel probe of %s failed (%s: %s); sweeping every size "
                    "without learning", sweep.key, type(exc).__name__, exc)
        learning.failed = True
        return _run(sweep, range(1, sweep.max_size + 1))
