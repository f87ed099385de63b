"""A cache that cannot be written is never fatal: the process carries on with a private one.

A full disk, a quota or a read-only mount shows up in a compiler, mid-warmup, as
`OSError: [Errno 28] No space left on device` or, with a little space left, as a C++ or
Triton compile error naming no errno at all. So a failed warmup is blamed on the cache when a
failed phase names a write errno, or when a small write into the entry now fails; then the
entry is given up and the compilers get a private temporary directory, removed at exit.

Pointing the compilers' variables elsewhere is not enough for inductor: it remembers, in
memory, a loader per C++ source it compiled, bound to the file it built in the old directory,
and a build that failed keeps its error. The plan's second run compiles the same sources, so
it would re-raise the full disk's link error from a directory already given up; those
in-memory caches are cleared with the move (`forget_compiled_paths`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import sys
import tempfile
from pathlib import Path

from warmgate.server.core.results import PhaseStatus, WarmupReport

# os.strerror of the errnos that mean "this filesystem takes no more writes".
WRITE_FAILURES = tuple(os.strerror(e) for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS))
# Enough for one compiled kernel or inductor artefact: a disk that cannot take this much
# cannot hold the warmup's output either.
PROBE_BYTES = 1 << 20
PROBE_NAME = ".write-probe"


def probe_writable(directory: Path, nbytes: int = PROBE_BYTES) -> str | None:
    """None if `nbytes` can be written and flushed to disk under `directory`, else why not."""
    path = directory / f"{PROBE_NAME}.{os.getpid()}"
    try:
        with open(path, "wb") as f:
            f.write(b"\0" * nbytes)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return f"{exc.strerror or exc} writing {nbytes} bytes under {directory}"
    finally:
        # Never created, or the directory itself is gone: nothing to clean up.
        with contextlib.suppress(OSError):
            path.unlink()
    return None


def cache_write_failure(report: WarmupReport, entry: Path | None) -> str | None:
    """Why a failed warmup is the cache's fault (a write errno, a failing probe), or None."""
    if report.succeeded:
        return None
    for phase in report.phases:
        if phase.status is PhaseStatus.FAILED and any(m in phase.detail for m in WRITE_FAILURES):
            return f"phase {phase.name}: {phase.detail}"
    if entry is None:
        return None
    problem = probe_writable(entry)
    if problem is None:
        return None
    failed = next((p.name for p in report.phases if p.status is PhaseStatus.FAILED), "?")
    return f"phase {failed} failed and the cache takes no more writes ({problem})"


def private_cache_dir() -> Path:
    """A fresh temporary directory for this process's compilers, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="warmgate-private-cache-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def forget_compiled_paths() -> None:
    """Drop what the compilers remember in memory about the directory they compiled into, so
    the next compile of the same source builds again under the new one. Only inductor keeps
    such loaders (Triton and FlashInfer look their cache directory up on each use); it is
    not imported here when nothing has imported it yet: then it remembers nothing."""
    if "torch._inductor.codecache" not in sys.modules:
        return
    from torch._inductor.utils import clear_caches

    clear_caches()
    forget_vec_isa()


def forget_vec_isa() -> None:
    """Inductor decides once per process which CPU vector ISA its C++ kernels may use, by
    building a probe in its cache directory; on a full volume that build fails, and the
    answer "none" stays (functools caches that clear_caches does not reach) after the move to
    the private cache. Kernels cached with vector code then build without the ISA's flags and
    fail to compile. Forgetting the answer makes the next compile probe again, in the new
    directory. Every ISA class may cache its own answer (torch 2.13's VecAVX512 and
    VecAVX512VNNI cache their __bool__ beside the base class's probe): left alone, the machine
    would come back from the degrade with AVX2 only. Private names, so only where this torch
    has them."""
    from torch._inductor import cpu_vec_isa

    base = getattr(cpu_vec_isa, "VecISA", None)
    cached = [getattr(cpu_vec_isa, "valid_vec_isa_list", None)]
    for cls in vars(cpu_vec_isa).values():
        if isinstance(cls, type) and base is not None and issubclass(cls, base):
            cached += vars(cls).values()
    for fn in cached:
        clear = getattr(fn, "cache_clear", None)
        if clear is not None:
            clear()
