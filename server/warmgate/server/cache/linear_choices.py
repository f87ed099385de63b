"""The dense linears' kernel per (weight shape, token count), cuBLAS or the Triton GEMV, as the
warmup's timing chose it (runner/linear_tuning.py): an entry kind of the compile cache, in the
entry's shape_sweeps/ directory beside the MoE launches and the sampler's kernel map.

A warm start reads it back and times nothing, so a restart also keeps every linear on the
kernel it ran before (the two round differently). The entry's key already holds the GPU, the
libraries, this build and the configuration; the file repeats the GPU and library identity,
and is ignored (everything is timed again) when it differs or a pair the plan needs is missing.
A pair is named "NxK:dtype:mM" (kernels/linear_choices.py: key_name).
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

LINEARS_FILE = "linear_choices.json"
FORMAT_VERSION = 1


def load_linear_choices(directory: Path, identity: Mapping[str, str], names: Sequence[str]
                        ) -> tuple[dict[str, bool] | None, str]:
    """({name: whether the GEMV runs it} for every name, "") when the file was written on this
    GPU and these libraries and holds every name; else (None, why not)."""
    path = directory / LINEARS_FILE
    data, why = read_measured(path, FORMAT_VERSION, identity, "timed")
    if data is None:
        return None, why
    try:
        choices = {str(name): bool(gemv) for name, gemv in data["gemv"].items()}
    except READ_ERRORS as exc:
        return None, unreadable(path, exc)
    missing = [name for name in names if name not in choices]
    if missing:
        return None, f"{path} lacks {missing[0]}"
    return {name: choices[name] for name in names}, ""


def save_linear_choices(directory: Path, identity: Mapping[str, str],
                        choices: Mapping[str, bool]) -> Path:
    """Write the file atomically (a reader never sees half of it); returns its path."""
    return write_measured(directory / LINEARS_FILE, FORMAT_VERSION, identity,
                          {"gemv": dict(sorted(choices.items()))})
