"""The shape sweeps' kernel maps: an entry kind of the compile cache, beside triton/, flashinfer/
and inductor/.

For each sweep of the sampler rows (a sampling variant, the verifier, the logprobs gather over
batch sizes 1..N), the sizes at which a kernel launches for the first time, and the largest,
learned once by the sweep that ran every size (warmup/kernel_probe.py, size_sweeps.py). A warm
start sweeps only those. The dense GEMMs keep no map: cuBLAS pays at every new shape
(warmup/gemm_shapes.py). The entry's key already holds the GPU, torch and the configuration; a
map repeats the GPU and library identity and is ignored (every size is swept) when they
differ, or when it lacks one of the sweeps asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from warmgate.server.cache.measured_file import (
    READ_ERRORS,
    read_measured,
    unreadable,
    write_measured,
)

# Set by apply_cache_env to the entry's shape_sweeps/ directory (cache/env.py).
ENV_VAR = "WARMGATE_SHAPE_SWEEP_DIR"
SAMPLER_FILE = "sampler_kernels.json"
# 2: each sweep keeps its largest size as well; a map of 1 lacks it.
# 3: the sizes where a kernel first launches, not the first size of each distinct sequence of
# kernels (size_sweeps.sizes_to_keep): a map of 2 holds more sizes than needed.
FORMAT_VERSION = 3


@dataclass(frozen=True)
class KernelMap:
    # The GPU and libraries the map was learned on (name -> version).
    identity: dict[str, str]
    # Sweep key (warmup.size_sweeps.SizeSweep.key) -> the sizes a warm start runs.
    sizes: dict[str, list[int]]


def kernel_map_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The entry's shape_sweeps/ directory, or None without a compile cache."""
    value = (os.environ if environ is None else environ).get(ENV_VAR)
    return Path(value) if value else None


def load_kernel_map(directory: Path, file_name: str, identity: Mapping[str, str],
                    keys: list[str]) -> tuple[KernelMap | None, str]:
    """(the map, "") when directory/file_name is there, readable, of this identity and holds
    every key; else (None, why not)."""
    path = directory / file_name
    data, why = read_measured(path, FORMAT_VERSION, identity, "learned")
    if data is None:
        return None, why
    try:
        found = KernelMap(identity=dict(data["identity"]),
                          sizes={k: [int(m) for m in v] for k, v in data["sizes"].items()})
    except READ_ERRORS as exc:
        return None, unreadable(path, exc)
    missing = [k for k in keys if k not in found.sizes]
    if missing:
        return None, f"{path} lacks the sweep {missing[0]}"
    return found, ""


def save_kernel_map(directory: Path, file_name: str, kernel_map: KernelMap) -> Path:
    """Write the map (atomically: a reader never sees half a file); returns its path."""
    return write_measured(directory / file_name, FORMAT_VERSION, kernel_map.identity,
                          {"sizes": dict(sorted(kernel_map.sizes.items()))})
