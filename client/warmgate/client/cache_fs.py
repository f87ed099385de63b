"""The compile cache's on-disk layout and protocol, pure filesystem (no torch, no grpc).

Shared by the server (`warmgate.server.cache`) and the CLI (`warmgate cache ls|prune`).

    D/
      .locks/<name>.fill   flock LOCK_EX while one process checks, rebuilds or fills the entry
      .locks/<name>.use    flock LOCK_SH by every process using the entry (prune needs LOCK_EX);
                           its mtime is the entry's last use
      .trash/              corrupt or half-written entries moved aside before a rebuild
      <name>/              name = the first 16 hex digits of the cache key
        key.json           {"key", "inputs", "created"}: what the key was computed from
        MANIFEST.json      {"files": {relpath: {"size", "sha256"}}}, written just before READY
        READY              {"when", "warmgate_version", "warmup_seconds", "key",
                            "manifest_sha256"}: the commit point, written last
        triton/ flashinfer/ inductor/   the libraries' own caches

Every metadata file is written to a temporary name, fsynced and renamed into place, so a
reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEY_FILE, MANIFEST_FILE, READY_FILE = "key.json", "MANIFEST.json", "READY"
LOCKS_DIR, TRASH_DIR = ".locks", ".trash"
METADATA_FILES = (KEY_FILE, MANIFEST_FILE, READY_FILE)
NAME_LEN = 16
# Files the libraries rewrite while using a filled entry (ninja's logs, lock files, temporary
# names): a manifest that recorded them would call a healthy entry corrupt.
_VOLATILE_SUFFIXES = (".lock", ".ninja_log", ".ninja_deps", ".tmp")
_VOLATILE_PARTS = (".tmp.", ".lock.")


def entry_name(key: str) -> str:
    return key[:NAME_LEN]


def atomic_write_json(path: Path, value: Any) -> None:
    """Write JSON to a temporary file beside `path`, fsync, rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{time.monotonic_ns()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, sort_keys=True, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's JSON object, or None when it is missing or unparseable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _volatile(rel: str) -> bool:
    base = rel.rsplit("/", 1)[-1]
    return base.endswith(_VOLATILE_SUFFIXES) or any(p in base for p in _VOLATILE_PARTS)


def build_manifest(entry: Path) -> dict[str, Any]:
    """Size and sha256 of every cached file under the entry (metadata and volatile excluded)."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(entry.rglob("*")):
        rel = path.relative_to(entry).as_posix()
        if not path.is_file() or path.is_symlink() or rel in METADATA_FILES or _volatile(rel):
            continue
        files[rel] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    return {"files": files}


def dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, n)).st_size
    return total


def check_entry(entry: Path, key: str | None = None) -> str | None:
    """Why the entry is not a valid READY entry for `key` (None: it is valid).

    Checks key.json, the READY marker, the manifest's digest and every file it lists.
    """
    meta = read_json(entry / KEY_FILE)
    if meta is None or not isinstance(meta.get("key"), str):
        return f"{KEY_FILE} is missing or unparseable"
    if key is not None and meta["key"] != key:
        return f"{KEY_FILE} records key {meta['key'][:16]}..., not {key[:16]}..."
    if entry_name(meta["key"]) != entry.name:
        return f"{KEY_FILE} records a key that does not match the directory name"
    if not (entry / READY_FILE).exists():
        return "no READY marker: a warmup did not finish here (crashed or still filling)"
    ready = read_json(entry / READY_FILE)
    if ready is None:
        return f"{READY_FILE} is unparseable"
    if ready.get("key") != meta["key"]:
        return f"{READY_FILE} was written for another key"
    try:
        manifest_sha = file_sha256(entry / MANIFEST_FILE)
    except OSError:
        return f"{MANIFEST_FILE} is missing"
    if manifest_sha != ready.get("manifest_sha256"):
        return f"{MANIFEST_FILE} does not match the digest in {READY_FILE}"
    manifest = read_json(entry / MANIFEST_FILE)
    files = manifest.get("files") if manifest else None
    if not isinstance(files, dict):
        return f"{MANIFEST_FILE} is unparseable"
    for rel, rec in files.items():
        path = entry / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"{rel} is listed in the manifest but missing"
        if size != rec.get("size"):
            return f"{rel} is {size} bytes, the manifest says {rec.get('size')} (truncated?)"
        if file_sha256(path) != rec.get("sha256"):
            return f"{rel} does not match its sha256 in the manifest"
    return None


def move_to_trash(root: Path, entry: Path) -> Path:
    """Rename the entry into D/.trash/ (atomic, same filesystem); returns its new path."""
    trash = root / TRASH_DIR
    trash.mkdir(parents=True, exist_ok=True)
    dest = trash / f"{entry.name}.{int(time.time())}.{os.getpid()}.{time.monotonic_ns()}"
    os.replace(entry, dest)
    return dest


def empty_trash(root: Path) -> None:
    for path in (root / TRASH_DIR).glob("*"):
        shutil.rmtree(path, ignore_errors=True)


# -- locks -------------------------------------------------------------------------------

def lock_path(root: Path, name: str, kind: str) -> Path:
    return root / LOCKS_DIR / f"{name}.{kind}"


class FileLock:
    """fcntl.flock on a lock file that is never deleted (deleting one races its openers)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)

    def acquire(self, *, shared: bool = False, blocking: bool = True) -> bool:
        flags = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        if not blocking:
            flags |= fcntl.LOCK_NB
        try:
            fcntl.flock(self._fd, flags)
        except BlockingIOError:
            return False
        return True

    def acquire_within(self, timeout_s: float, *, poll_s: float = 0.1) -> bool:
        """LOCK_EX, retrying until `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        while not self.acquire(blocking=False):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the lock too
            self._fd = -1

    def touch(self) -> None:
        os.utime(self.path)


@contextlib.contextmanager
def try_exclusive(root: Path, name: str) -> Iterator[bool]:
    """Both of an entry's locks, exclusively and without waiting: True if nobody holds them."""
    locks = [FileLock(lock_path(root, name, k)) for k in ("use", "fill")]
    try:
        got = all(lock.acquire(blocking=False) for lock in locks)
        yield got
    finally:
        for lock in locks:
            lock.close()


# -- listing and pruning ---------------------------------------------------------------------

@dataclass
class EntryInfo:
    name: str
    path: str
    state: str  # ready | incomplete | corrupt
    key: str = ""
    size_bytes: int = 0
    last_used: float = 0.0
    problem: str = ""
    ready: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "state": self.state, "key": self.key,
                "size_bytes": self.size_bytes, "last_used": self.last_used,
                "problem": self.problem, "ready": self.ready, "inputs": self.inputs}


def entry_info(root: Path, entry: Path, *, verify: bool = True) -> EntryInfo:
    meta = read_json(entry / KEY_FILE) or {}
    use = lock_path(root, entry.name, "use")
    last_used = use.stat().st_mtime if use.exists() else entry.stat().st_mtime
    problem = check_entry(entry) if verify else None
    if problem is None:
        state = "ready" if (entry / READY_FILE).exists() else "incomplete"
    else:
        state = "incomplete" if not (entry / READY_FILE).exists() else "corrupt"
    return EntryInfo(name=entry.name, path=str(entry), state=state, key=str(meta.get("key", "")),
                     size_bytes=dir_size(entry), last_used=last_used, problem=problem or "",
                     ready=read_json(entry / READY_FILE) or {},
                     inputs=meta.get("inputs") if isinstance(meta.get("inputs"), dict) else {})


def list_entries(root: Path, *, verify: bool = True) -> list[EntryInfo]:
    """Every entry under the cache directory, most recently used first."""
    if not root.is_dir():
        return []
    entries = [entry_info(root, p, verify=verify) for p in root.iterdir()
               if p.is_dir() and not p.name.startswith(".")]
    return sorted(entries, key=lambda e: e.last_used, reverse=True)


@dataclass
class PruneResult:
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)


def prune(root: Path, keep: int) -> PruneResult:
    """Keep the `keep` most recently used READY entries; remove every other entry whose locks
    nobody holds (a held lock means a server uses it or a warmup is filling it)."""
    result = PruneResult()
    ready_seen = 0
    for info in list_entries(root):
        if info.state == "ready" and ready_seen < keep:
            ready_seen += 1
            result.kept.append(info.name)
            continue
        with try_exclusive(root, info.name) as free:
            if not free:
                result.in_use.append(info.name)
                continue
            move_to_trash(root, Path(info.path))
            result.removed.append(info.name)
    empty_trash(root)
    return result


def diff_key_inputs(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'name: old -> new' for every key input that differs (nested dicts flattened)."""

    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    a, b = flat(old), flat(new)
    return [f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}"
            for k in sorted(set(a) | set(b)) if a.get(k, "<unset>") != b.get(k, "<unset>")]
