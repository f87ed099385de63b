"""Which token counts of a GEMM pick distinct kernels: learned by profiling the full sweep.

cuBLAS's choice for a weight of fixed shape is a deterministic function of the token count M,
and it changes at a handful of M (tile shapes, split-K), not at each one. The sweep exists so
that no first batch loads a kernel module or runs a kernel for the first time; one M per
distinct kernel sequence does that. The full sweep is run under the profiler once, with a
marker kernel after each M, so the kernels between two markers are that M's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

# The kernel torch.cuda._sleep launches (ATen's Sleep.cu), used as the boundary between Ms.
MARKER = "spin_kernel"
# What a probe returns: for M = 1..max_m, the kernels (names) that M's GEMM launched.
KernelProbe = Callable[[torch.Tensor, int], list[tuple[str, ...]]]


class ProbeError(RuntimeError):
    """The profile could not be split into one kernel sequence per M (nothing is kept)."""


def distinct_sizes(signatures: Sequence[tuple[str, ...]]) -> list[int]:
    """The smallest M of each distinct kernel sequence (M = index + 1); an M whose sequence
    is unknown (empty) is always kept."""
    first: dict[tuple[str, ...], int] = {}
    unknown: list[int] = []
    for m, signature in enumerate(signatures, start=1):
        if not signature:
            unknown.append(m)
        else:
            first.setdefault(signature, m)
    return sorted([*first.values(), *unknown])


def split_at_markers(kernel_names: Sequence[str], num_sizes: int) -> list[tuple[str, ...]]:
    """The kernels between consecutive markers, one tuple per M; ProbeError unless exactly
    num_sizes markers were seen (a dropped event would shift every M after it)."""
    groups: list[tuple[str, ...]] = []
    current: list[str] = []
    for name in kernel_names:
        if MARKER in name:
            groups.append(tuple(current))
            current = []
        else:
            current.append(name)
    if len(groups) != num_sizes or current:
        raise ProbeError(f"the profile holds {len(groups)} markers and {len(current)} "
                         f"kernels after the last, for {num_sizes} sizes")
    return groups


@torch.inference_mode()
def profile_kernels(weight: torch.Tensor, max_m: int) -> list[tuple[str, ...]]:
    """Run F.linear at M = 1..max_m (the full sweep) under the profiler; each M's kernels.

    Device activity only, read from the raw kineto events: the per-op event tree the
    profiler can build is not needed and would cost more than the sweep itself.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = torch.zeros(max_m, weight.shape[1], device=weight.device, dtype=weight.dtype)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for m in range(1, max_m + 1):
            F.linear(x[:m], weight)
            torch.cuda._sleep(1)
        torch.cuda.synchronize(weight.device)
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise ProbeError("the profiler kept no kineto results")
    kernels = sorted((e for e in results.events() if e.device_type() == DeviceType.CUDA),
                     key=lambda e: e.start_ns())
    return split_at_markers([e.name() for e in kernels], max_m)


def kernel_identity(device: torch.device) -> dict[str, str]:
    """What the kernel choice depends on besides the shapes: the GPU and the libraries."""
    if device.type != "cuda":
        return {"gpu": device.type, "torch": torch.__version__}
    major, minor = torch.cuda.get_device_capability(device)
    return {"gpu": torch.cuda.get_device_name(device), "capability": f"{major}.{minor}",
            "torch": torch.__version__, "cuda": str(torch.version.cuda)}
