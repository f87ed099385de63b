"""The header of a safetensors file, read in plain Python (8-byte length, then JSON, as the
format defines them): no torch import, so the start-up checks run while torch is still
loading in the background.

Every tensor's byte span is checked against its dtype and shape here, at start-up: a header
that claims F64 over F32-sized data would otherwise pass and fail half-way through the load.
And no two tensors' spans may overlap, as the safetensors library requires: two tensors
reading the same bytes are a corrupt (or crafted) file, which the loader would otherwise
serve.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from warmgate.server.config.json_text import parse_json
from warmgate.server.config.model_load_error import ModelLoadError

# Bytes per element of the safetensors dtypes the loader (runner.weight_stream) can copy.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header; begin/end are absolute offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors of one safetensors file, from its header; ModelLoadError naming the file
    (and the tensor) for one that is unreadable, shorter than its header says, or whose
    byte span disagrees with its dtype and shape."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise ValueError(f"a {length}-byte header in a {size}-byte file")
            header = parse_json(f.read(length))
        header.pop("__metadata__", None)
        base = 8 + length
        entries = {name: TensorEntry(name, info["dtype"], tuple(info["shape"]),
                                     base + info["data_offsets"][0],
                                     base + info["data_offsets"][1])
                   for name, info in header.items()}
    except (OSError, struct.error, ValueError, KeyError, TypeError, IndexError,
            AttributeError) as exc:
        raise ModelLoadError(path, "header", f"not a readable safetensors file: "
                             f"{type(exc).__name__}: {exc}") from exc
    for e in entries.values():
        _check_entry(path, e, size)
    _check_disjoint(path, entries.values())
    return entries


def _check_disjoint(path: Path, entries: Iterable[TensorEntry]) -> None:
    """ModelLoadError naming two tensors whose byte spans overlap (empty ones take none)."""
    spans = sorted((e for e in entries if e.end > e.begin), key=lambda e: (e.begin, e.end))
    for before, after in itertools.pairwise(spans):
        if after.begin < before.end:
            raise ModelLoadError(path, after.name, f"bytes {after.begin}..{after.end} overlap "
                                 f"{before.name}'s {before.begin}..{before.end} (a corrupt "
                                 "file: each tensor must have bytes of its own)")


def _check_entry(path: Path, e: TensorEntry, size: int) -> None:
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in e.shape):
        raise ModelLoadError(path, e.name, f"shape {list(e.shape)} is not a list of sizes")
    if not (isinstance(e.begin, int) and isinstance(e.end, int)):
        raise ModelLoadError(path, e.name, "data_offsets are not integers")
    if e.end > size or e.begin > e.end:
        raise ModelLoadError(path, e.name, f"bytes {e.begin}..{e.end} of a {size}-byte "
                             "file (a truncated file)")
    if e.dtype not in DTYPE_BYTES:
        raise ModelLoadError(path, e.name, f"dtype {e.dtype!r} is not one warmgate can load "
                             f"(it knows {', '.join(DTYPE_BYTES)})")
    need = e.numel * DTYPE_BYTES[e.dtype]
    if e.end - e.begin != need:
        raise ModelLoadError(path, e.name, f"holds {e.end - e.begin} bytes, its dtype "
                             f"{e.dtype} and shape {list(e.shape)} need {need} (a corrupt "
                             "file)")
