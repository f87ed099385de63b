"""Bound `.trash/`: entries moved aside before a rebuild are kept for a post-mortem, a few.

Without a bound every rebuild (a corrupt entry, a crashed fill) left a copy of a whole entry
behind until someone ran `warmgate cache prune`. The newest TRASH_KEEP entries stay, as long
as together they hold at most TRASH_MAX_BYTES; older or bigger ones are deleted, oldest first.
A process that gives its entry up on a full disk empties the trash: space comes first.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from warmgate.client import cache_fs

logger = logging.getLogger(__name__)

TRASH_KEEP = 2
TRASH_MAX_BYTES = 512 << 20


def _moved_at(path: Path) -> float:
    """When the entry was moved aside: the time cache_fs.move_to_trash put in its name
    (a rename keeps the directory's own mtime, which is when the entry was last written)."""
    try:
        return float(path.name.split(".")[-3])
    except (IndexError, ValueError):
        return path.stat().st_mtime


def bound_trash(root: Path, *, keep: int = TRASH_KEEP, max_bytes: int = TRASH_MAX_BYTES
                ) -> list[Path]:
    """Delete trashed entries beyond the newest `keep` or `max_bytes`; returns the deleted."""
    trash = root / cache_fs.TRASH_DIR
    try:
        items = sorted(trash.iterdir(), key=_moved_at, reverse=True)
    except OSError:
        return []  # no trash yet (or another process just emptied it)
    kept_bytes, removed = 0, []
    for index, path in enumerate(items):
        size = cache_fs.dir_size(path) if path.is_dir() else 0
        if index < keep and kept_bytes + size <= max_bytes:
            kept_bytes += size
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        logger.info("compile cache trash %s: deleted %d old entr%s, kept %d (%d bytes; bound: "
                    "%d entries, %d bytes)", trash, len(removed),
                    "y" if len(removed) == 1 else "ies", len(items) - len(removed), kept_bytes,
                    keep, max_bytes)
    return removed
