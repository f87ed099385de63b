"""Stream safetensors bytes into model tensors at the speed of the bytes.

A per-tensor `safe_open(...).get_tensor(name)` followed by `target.copy_(...)` copies from
pageable memory: the driver stages every tensor through its own small pinned buffer, one
synchronous copy at a time, and the mmap behind it takes a page fault per 4 KiB. Here the file
is read with `os.preadv` (which releases the GIL) by several reader threads, each into its own
slice of one pinned buffer, while the main thread issues non_blocking host-to-device copies on
a side stream from the slices already filled. With the page cache warm the readers run at
memory speed in parallel; with it cold the disk reads of the next slices overlap the copies of
the previous ones. On the CPU the bytes are read straight into the tensors, with no staging.

A file whose dtype differs from the model's is read into a temporary tensor of the file's
dtype on the device and cast there, as `copy_` did before.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from warmgate.server.config.hf_config import ModelLoadError
from warmgate.server.config.weight_files import TensorEntry

# The safetensors dtype names (the format's spec) this loader can copy into torch tensors.
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    **({"F8_E4M3": torch.float8_e4m3fn} if hasattr(torch, "float8_e4m3fn") else {}),
    **({"F8_E5M2": torch.float8_e5m2} if hasattr(torch, "float8_e5m2") else {}),
}
# One staging slice per reader: large enough that a thread hand-off costs little next to the
# read, small enough that the pinned buffer (slices x readers) stays a small allocation.
DEFAULT_SLICE_BYTES = 16 * 2**20
MAX_READERS = 8


@dataclass
class _Piece:
    """Bytes [buffer_offset, +nbytes) of a read go to `dest` (a uint8 view); once the
    tensor's last piece is copied, `cast` (if any) is copied into its target."""

    buffer_offset: int
    dest: torch.Tensor
    cast: tuple[torch.Tensor, torch.Tensor] | None = None  # (target, temporary)


@dataclass
class _Read:
    fd: int
    path: Path
    offset: int
    nbytes: int
    pieces: list[_Piece] = field(default_factory=list)


@dataclass(frozen=True)
class StreamStats:
    bytes_read: int
    num_reads: int
    num_readers: int
    slice_bytes: int
    staged: bool


def _destination(path: Path, entry: TensorEntry, target: torch.Tensor
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """The uint8 view the file's bytes land in, and the (target, temporary) to cast, if any."""
    dtype = SAFETENSORS_DTYPES.get(entry.dtype)
    if dtype is None:
        raise ModelLoadError(path, entry.name, f"dtype {entry.dtype} is not one warmgate can "
                             f"load (it knows {', '.join(SAFETENSORS_DTYPES)})")
    numel = 1
    for n in entry.shape:
        numel *= n
    expected = numel * torch.empty((), dtype=dtype).element_size()
    if entry.end - entry.begin != expected:
        raise ModelLoadError(path, entry.name, f"holds {entry.end - entry.begin} bytes, its "
                             f"dtype {entry.dtype} and shape {list(entry.shape)} need "
                             f"{expected} (a corrupt file)")
    if dtype == target.dtype and target.is_contiguous():
        return target.view(-1).view(torch.uint8), None
    temp = torch.empty(entry.shape, dtype=dtype, device=target.device)
    return temp.view(-1).view(torch.uint8), (target, temp)


def plan_reads(copies: Sequence[tuple[int, Path, TensorEntry, torch.Tensor]],
               slice_bytes: int) -> list[_Read]:
    """Cut the (fd, file, tensor, target) copies into reads of at most slice_bytes each.

    Tensors are taken in file order, so neighbours (the small norm weights) share one read;
    a tensor larger than a slice is split across several.
    """
    reads: list[_Read] = []
    ordered = sorted(copies, key=lambda c: (str(c[1]), c[2].begin))
    for fd, path, entry, target in ordered:
        dest, cast = _destination(path, entry, target)
        total = entry.end - entry.begin
        done = 0
        while done < total:
            last = reads[-1] if reads else None
            if (last is None or last.fd != fd or last.nbytes >= slice_bytes
                    or last.offset + last.nbytes != entry.begin + done):
                last = _Read(fd, path, entry.begin + done, 0)
                reads.append(last)
            n = min(total - done, slice_bytes - last.nbytes)
            last.pieces.append(_Piece(last.nbytes, dest[done:done + n]))
            last.nbytes += n
            done += n
        if cast is not None and total:  # an empty tensor has nothing to cast
            reads[-1].pieces[-1].cast = cast
    return reads


def _read_into(read: _Read, buffer: memoryview, wait: torch.cuda.Event | None) -> None:
    """Fill buffer[:read.nbytes] from the file; first wait until the copies out of it ended."""
    if wait is not None:
        wait.synchronize()
    done = 0
    while done < read.nbytes:
        n = os.preadv(read.fd, [buffer[done:read.nbytes]], read.offset + done)
        if n == 0:
            raise ModelLoadError(read.path, "data", f"the file ends at byte "
                                 f"{read.offset + done}, its header says it holds more "
                                 "(a truncated file)")
        done += n


def _read_direct(read: _Read) -> None:
    """CPU targets: read each piece straight into its tensor's bytes."""
    offset = read.offset
    for piece in read.pieces:
        view = piece.dest.numpy().data
        _read_into(_Read(read.fd, read.path, offset, view.nbytes), view, None)
        offset += view.nbytes


def stream_into(copies: Sequence[tuple[Path, TensorEntry, torch.Tensor]], device: torch.device,
                *, slice_bytes: int = DEFAULT_SLICE_BYTES, num_readers: int | None = None,
                staged: bool | None = None) -> StreamStats:
    """Copy every (file, tensor entry, target) from disk into its target.

    `staged` (default: the device is CUDA) reads into pinned slices and copies from there on
    a side stream; without it the bytes are read straight into the targets (CPU tensors).
    Returns when every copy has finished.
    """
    staged = device.type == "cuda" if staged is None else staged
    readers = num_readers or max(1, min(MAX_READERS, os.cpu_count() or 1))
    fds: dict[Path, int] = {}
    try:
        for path, _, _ in copies:
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY)
        reads = plan_reads([(fds[p], p, e, t) for p, e, t in copies], slice_bytes)
        with ThreadPoolExecutor(readers, thread_name_prefix="warmgate-weights") as pool:
            if staged:
                _stream_staged(reads, device, pool, readers, slice_bytes)
            else:
                for future in [pool.submit(_read_direct, r) for r in reads]:
                    future.result()
                # A tensor split over several reads is whole only once all of them ended, in
                # whatever order the readers finished: cast it then.
                for piece in (p for r in reads for p in r.pieces if p.cast is not None):
                    piece.cast[0].copy_(piece.cast[1])
    finally:
        for fd in fds.values():
            os.close(fd)
    return StreamStats(bytes_read=sum(r.nbytes for r in reads), num_reads=len(reads),
                       num_readers=readers, slice_bytes=slice_bytes, staged=staged)


def _stream_staged(reads: list[_Read], device: torch.device, pool: ThreadPoolExecutor,
                   readers: int, slice_bytes: int) -> None:
    """Readers fill slices i % readers ahead; the main thread copies slice after slice out.

    A reader reuses a slice only after the event recorded behind that slice's copies fired,
    so the device never reads bytes being overwritten.
    """
    cuda = device.type == "cuda"
    nslices = min(readers, len(reads))
    if nslices == 0:
        return
    buffer = torch.empty(nslices * slice_bytes, dtype=torch.uint8, pin_memory=cuda)
    host = buffer.numpy().data
    slices = [host[i * slice_bytes:(i + 1) * slice_bytes] for i in range(nslices)]
    stream = torch.cuda.Stream(device) if cuda else None
    if stream is not None:  # after whatever the caller queued on the targets
        stream.wait_stream(torch.cuda.current_stream(device))
    pending: deque[Future[None]] = deque(
        pool.submit(_read_into, reads[i], slices[i], None) for i in range(nslices))
    for i, read in enumerate(reads):
        pending.popleft().result()
        k = i % nslices
        base = k * slice_bytes
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            for piece in read.pieces:
                n = piece.dest.numel()
                piece.dest.copy_(buffer[base + piece.buffer_offset:base + piece.buffer_offset
                                        + n], non_blocking=cuda)
                if piece.cast is not None:
                    piece.cast[0].copy_(piece.cast[1], non_blocking=cuda)
        done: torch.cuda.Event | None = None
        if stream is not None:
            done = torch.cuda.Event()
            done.record(stream)
        if i + nslices < len(reads):
            pending.append(pool.submit(_read_into, reads[i + nslices], slices[k], done))
    if stream is not None:
        stream.synchronize()

