"""Which sizes of a size-indexed call a warm start must run: learned by profiling the full sweep.

A sweep calls one operation at every size 1..N (the sampler at every batch size) so that no
first batch loads a kernel module or runs a kernel for the first time. The kernels an operation
launches are a deterministic function of its size, drawn from a small set (a sort's block size,
a reduction's split). Where nothing else is chosen per size, running each kernel once is the
sweep's work: the sizes where a kernel launches for the first time cover it (covering_sizes).
A dense GEMM is not such an operation: cuBLAS chooses an algorithm at every new shape
(warmup/gemm_shapes.py), so its sweep keeps no map. The full sweep is run under the profiler
once, with a marker kernel after each size, so the kernels between two markers are that
size's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# The kernel torch.cuda._sleep launches (ATen's Sleep.cu), used as the boundary between sizes.
MARKER = "spin_kernel"


class ProbeError(RuntimeError):
    """The profile could not be split into one kernel sequence per size (nothing is kept)."""


def covering_sizes(signatures: Sequence[tuple[str, ...]]) -> list[int]:
    """The sizes (size = index + 1) where a kernel launches for the first time in the sweep,
    in order: run at these alone, every kernel of the full sweep runs at least once. A size
    whose kernels are unknown (empty) is always kept."""
    seen: set[str] = set()
    kept: list[int] = []
    for m, signature in enumerate(signatures, start=1):
        if not signature or not seen.issuperset(signature):
            kept.append(m)
            seen.update(signature)
    return kept


def split_at_markers(kernel_names: Sequence[str], num_sizes: int) -> list[tuple[str, ...]]:
    """The kernels between consecutive markers, one tuple per size; ProbeError unless exactly
    num_sizes markers were seen (a dropped event would shift every size after it)."""
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
def profile_calls(call: Callable[[int], object], max_size: int, device: torch.device
                  ) -> list[tuple[str, ...]]:
    """Run call(1..max_size) (the full sweep) under the profiler; each size's kernels.

    Device activity only, read from the raw kineto events: the per-op event tree the
    profiler can build is not needed and would cost more than the sweep itself.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for m in range(1, max_size + 1):
            call(m)
            torch.cuda._sleep(1)
        torch.cuda.synchronize(device)
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise ProbeError("the profiler kept no kineto results")
    kernels = sorted((e for e in results.events() if e.device_type() == DeviceType.CUDA),
                     key=lambda e: e.start_ns())
    return split_at_markers([e.name() for e in kernels], max_size)


def kernel_identity(device: torch.device) -> dict[str, str]:
    """What the kernel choice depends on besides the sizes: the GPU and the libraries."""
    if device.type != "cuda":
        return {"gpu": device.type, "torch": torch.__version__}
    major, minor = torch.cuda.get_device_capability(device)
    return {"gpu": torch.cuda.get_device_name(device), "capability": f"{major}.{minor}",
            "torch": torch.__version__, "cuda": str(torch.version.cuda)}
