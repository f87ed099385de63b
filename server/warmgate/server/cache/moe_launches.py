"""The fused MoE kernel's launch per token-count bucket, as the warmup's autotune chose it: an
entry kind of the compile cache, in the entry's shape_sweeps/ directory beside the sampler's
kernel map.

A warm start reads it back and times nothing (runner.moe_launches.MoELaunches.preset). The
entry's key already holds the GPU, torch and the configuration; the file repeats the GPU and
library identity and the expert shape, and is ignored (the buckets are tuned again) when
either differs or a bucket the plan needs is missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from warmgate.server.cache.measured_file import (
    READ_ERRORS,
    read_measured,
    unreadable,
    write_measured,
)

MOE_FILE = "moe_launches.json"
FORMAT_VERSION = 1
# A launch as stored: block_m, block_n, block_k, num_warps, num_stages.
Launch = tuple[int, int, int, int, int]


def load_moe_launches(directory: Path, identity: Mapping[str, str], shape: str,
                      buckets: Sequence[int]) -> tuple[dict[int, Launch] | None, str]:
    """({bucket: launch} for every bucket, "") when the file was written on this GPU and these
    libraries for this expert shape; else (None, why not)."""
    path = directory / MOE_FILE
    data, why = read_measured(path, FORMAT_VERSION, identity, "tuned")
    if data is None:
        return None, why
    try:
        found_shape = data["shape"]
        launches: dict[int, Launch] = {}
        for bucket, launch in data["launches"].items():
            values = tuple(int(v) for v in launch)
            if len(values) != 5:
                raise ValueError(f"bucket {bucket}: {launch!r} is not 5 integers")
            launches[int(bucket)] = values  # type: ignore[assignment]
    except READ_ERRORS as exc:
        return None, unreadable(path, exc)
    if found_shape != shape:
        return None, f"{path} was tuned for experts {found_shape}, these are {shape}"
    missing = [b for b in buckets if b not in launches]
    if missing:
        return None, f"{path} lacks the bucket <={missing[0]}"
    return launches, ""


def save_moe_launches(directory: Path, identity: Mapping[str, str], shape: str,
                      launches: Mapping[int, Launch]) -> Path:
    """Write the file atomically (a reader never sees half of it); returns its path."""
    return write_measured(directory / MOE_FILE, FORMAT_VERSION, identity, {
        "shape": shape, "launches": {str(b): list(v) for b, v in sorted(launches.items())}})
