"""The fused MoE kernel's launch per token-count bucket, as the warmup's autotune chose it: an
entry kind of the compile cache, in the entry's shape_sweeps/ directory beside the sampler's
kernel map.

A warm start reads it back and times nothing (runner.moe_launches.MoELaunches.preset). The
entry's key already holds the GPU, torch and the configuration; the file repeats the GPU and
library identity and the expert shape, and is ignored (the buckets are tuned again) when
either differs or a bucket the plan needs is missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

MOE_FILE = "moe_launches.json"
FORMAT_VERSION = 1
# A launch as stored: block_m, block_n, block_k, num_warps, num_stages.
Launch = tuple[int, int, int, int, int]


def load_moe_launches(directory: Path, identity: Mapping[str, str], shape: str,
                      buckets: Sequence[int]) -> tuple[dict[int, Launch] | None, str]:
    """({bucket: launch} for every bucket, "") when the file was written on this GPU and these
    libraries for this expert shape; else (None, why not)."""
    path = directory / MOE_FILE
    if not path.exists():
        return None, f"no {path} yet"
    try:
        data = json.loads(path.read_text())
        version, found_identity, found_shape = data["version"], data["identity"], data["shape"]
        launches: dict[int, Launch] = {}
        for bucket, launch in data["launches"].items():
            values = tuple(int(v) for v in launch)
            if len(values) != 5:
                raise ValueError(f"bucket {bucket}: {launch!r} is not 5 integers")
            launches[int(bucket)] = values  # type: ignore[assignment]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"{path} is unreadable ({type(exc).__name__}: {exc})"
    if version != FORMAT_VERSION:
        return None, f"{path} has format {version}, this build reads {FORMAT_VERSION}"
    if found_identity != dict(identity):
        return None, f"{path} was tuned on {found_identity}, this is {dict(identity)}"
    if found_shape != shape:
        return None, f"{path} was tuned for experts {found_shape}, these are {shape}"
    missing = [b for b in buckets if b not in launches]
    if missing:
        return None, f"{path} lacks the bucket <={missing[0]}"
    return launches, ""


def save_moe_launches(directory: Path, identity: Mapping[str, str], shape: str,
                      launches: Mapping[int, Launch]) -> Path:
    """Write the file atomically (a reader never sees half of it); returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MOE_FILE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"version": FORMAT_VERSION, "identity": dict(identity),
                               "shape": shape,
                               "launches": {str(b): list(v) for b, v in sorted(launches.items())}},
                              indent=1) + "\n")
    os.replace(tmp, path)
    return path
