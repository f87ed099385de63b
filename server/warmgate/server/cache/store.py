"""One process's use of a cache entry: open (check, wait, rebuild), fill, commit.

Protocol (see warmgate.client.cache_fs for the layout):
1. take `.locks/<name>.use` LOCK_SH for the process's lifetime (prune skips a held entry);
2. take `.locks/<name>.fill` LOCK_EX, waiting while another process fills the entry;
3. under it: a valid READY entry is a HIT (the fill lock is released at once); no entry is a
   MISS; an entry without a valid READY marker (missing/unparseable key.json or marker, key
   mismatch, a file whose size or sha256 differs from the manifest) is moved to .trash/ and
   recreated: REBUILT. For MISS and REBUILT, key.json is written and the fill lock is held
   through the warmup;
4. after a successful warmup: MANIFEST.json, then READY (both by atomic rename), then the
   fill lock is released. A failed warmup releases it without a marker.
Any filesystem error is never fatal: opening fails to state "error"; a write that fails
while filling (a full disk, mid-warmup) or committing gives the entry up. Either way the
compilers carry on in a private temporary directory and the entry reports `degraded`
(cache/degrade.py).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmgate.client import cache_fs
from warmgate.server.cache.degrade import forget_compiled_paths, private_cache_dir
from warmgate.server.cache.env import EnvResult, apply_cache_env, repoint_cache_env
from warmgate.server.cache.key import cache_key, dist_versions, key_inputs
from warmgate.server.cache.trash import bound_trash
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.config.server_config import CACHE_LOCK_TIMEOUT_S

logger = logging.getLogger(__name__)

HIT, MISS, REBUILT, ERROR, LOCK_TIMEOUT = "hit", "miss", "rebuilt", "error", "lock_timeout"
SIZE_TTL_S = 5.0


@dataclass
class CacheInfo:
    """What the report and GetStatus say about the entry."""

    state: str
    directory: str
    key: str = ""
    entry: str = ""
    size_bytes: int = 0
    detail: str = ""
    waited_s: float = 0.0
    respected_env: dict[str, str] = field(default_factory=dict)
    # A write into the cache failed: the compilers use a private temporary directory now
    # and nothing this process compiles reaches --cache-dir (detail says why).
    degraded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "directory": self.directory, "key": self.key,
                "entry": self.entry, "size_bytes": self.size_bytes, "detail": self.detail,
                "waited_s": round(self.waited_s, 3), "respected_env": dict(self.respected_env),
                "degraded": self.degraded}


class CompileCache:
    def __init__(self, root: str | Path, *, lock_timeout_s: float = CACHE_LOCK_TIMEOUT_S,
                 environ: MutableMapping[str, str] | None = None) -> None:
        self.root = Path(root).absolute()
        self._lock_timeout_s = lock_timeout_s
        self._environ = environ
        self._use: cache_fs.FileLock | None = None
        self._fill: cache_fs.FileLock | None = None
        self.entry: Path | None = None
        self.info = CacheInfo(state="", directory=str(self.root))
        self.env = EnvResult()
        self._size_at = 0.0

    @property
    def filling(self) -> bool:
        return self._fill is not None

    def open(self, config: RunnerConfig, *, inputs: dict[str, Any] | None = None) -> CacheInfo:
        """Find or make the entry for this config and point the compilers' caches into it."""
        try:
            inputs = inputs if inputs is not None else key_inputs(config)
            self._open(inputs)
        except OSError as exc:
            self.close()
            self.info = CacheInfo(state=ERROR, directory=str(self.root), detail=str(exc))
            self.degrade(f"opening the entry failed: {exc}")
        return self.info

    def degrade(self, reason: str) -> None:
        """A write into the cache failed: give the entry up and carry on in a private one.

        The entry, half-written, is moved to .trash/ (or deleted if even that fails) and the
        trash emptied, so the space goes back to the pods sharing the volume; the fill lock
        is released without READY, so the next opener builds the entry again.
        """
        if self.info.degraded:
            return
        given_up = self._give_up_entry()
        private = private_cache_dir()
        if self.env.applied:
            self.env = repoint_cache_env(self.env, private, self._environ)
        else:
            self.env = apply_cache_env(private, self._environ)
        forget_compiled_paths()
        self.info.degraded = True
        self.info.detail = reason
        self.info.respected_env = self.env.respected
        logger.error("compile cache degraded: %s; %s; compiling into the private temporary "
                     "cache %s for this process", reason, given_up, private)

    def _give_up_entry(self) -> str:
        entry, filling = self.entry, self._fill is not None
        self._release_fill()
        if entry is None or not filling:
            return "no entry of ours to give up"
        try:
            moved = cache_fs.move_to_trash(self.root, entry)
            gone = f"entry {entry} moved to {moved}"
        except OSError:
            shutil.rmtree(entry, ignore_errors=True)
            gone = f"entry {entry} deleted"
        bound_trash(self.root, keep=0)
        self.entry = None
        return gone + " (trash emptied)"

    def _open(self, inputs: dict[str, Any]) -> None:
        key = cache_key(inputs)
        name = cache_fs.entry_name(key)
        entry = self.root / name
        self.root.mkdir(parents=True, exist_ok=True)
        self._use = cache_fs.FileLock(cache_fs.lock_path(self.root, name, "use"))
        self._use.acquire(shared=True)
        self._use.touch()
        fill = cache_fs.FileLock(cache_fs.lock_path(self.root, name, "fill"))
        start = time.monotonic()
        if not fill.acquire(blocking=False):
            logger.info("compile cache entry %s is being filled by another process; waiting "
                        "up to %.0f s for it", entry, self._lock_timeout_s)
            if not fill.acquire_within(self._lock_timeout_s):
                fill.close()
                self.info = CacheInfo(state=LOCK_TIMEOUT, directory=str(self.root), key=key,
                                      entry=str(entry), waited_s=time.monotonic() - start,
                                      detail="another process held the fill lock for "
                                             f"{self._lock_timeout_s:.0f} s; running without "
                                             "the cache")
                logger.error("%s", self.info.detail)
                return
        waited = time.monotonic() - start
        problem = cache_fs.check_entry(entry, key) if entry.exists() else None
        if entry.exists() and problem is None:
            fill.close()  # a hit: nothing to write
            state, detail = HIT, "READY entry found; manifest verified"
        else:
            state = MISS if not entry.exists() else REBUILT
            if state == REBUILT:
                moved = cache_fs.move_to_trash(self.root, entry)
                logger.warning("compile cache entry %s is not usable (%s); moved to %s and "
                               "rebuilding", entry, problem, moved)
                bound_trash(self.root)
                detail = f"rebuilt: {problem}"
            else:
                detail = "new entry"
                self._explain_miss(inputs, name)
            entry.mkdir(parents=True)
            cache_fs.atomic_write_json(entry / cache_fs.KEY_FILE, {
                "key": key, "inputs": inputs, "created": time.time()})
            self._fill = fill
        self.entry = entry
        self.env = apply_cache_env(entry, self._environ)
        self.info = CacheInfo(state=state, directory=str(self.root), key=key, entry=str(entry),
                              detail=detail, waited_s=waited, respected_env=self.env.respected)
        self.refresh_size(force=True)
        logger.info("compile cache %s: %s (key %s, %s)", entry, state, key[:16], detail)

    def _explain_miss(self, inputs: dict[str, Any], name: str) -> None:
        """A new key next to older entries: log which inputs differ from the newest one."""
        others = [e for e in cache_fs.list_entries(self.root, verify=False) if e.name != name]
        if not others:
            return
        newest = others[0]
        diff = cache_fs.diff_key_inputs(newest.inputs, inputs)
        logger.warning("compile cache miss: new key next to %d older entr%s; versus the most "
                       "recently used (%s): %s", len(others), "y" if len(others) == 1 else "ies",
                       newest.name, "; ".join(diff) or "no input differs (schema change?)")

    def commit(self, warmup_seconds: float) -> None:
        """After a successful warmup: manifest, then READY, then release the fill lock."""
        if self._fill is None or self.entry is None:
            return
        try:
            cache_fs.atomic_write_json(self.entry / cache_fs.MANIFEST_FILE,
                                       cache_fs.build_manifest(self.entry))
            cache_fs.atomic_write_json(self.entry / cache_fs.READY_FILE, {
                "when": time.time(), "warmgate_version": dist_versions(("warmgate",))["warmgate"],
                "warmup_seconds": round(warmup_seconds, 3), "key": self.info.key,
                "manifest_sha256": cache_fs.file_sha256(self.entry / cache_fs.MANIFEST_FILE)})
            logger.info("compile cache entry %s is READY", self.entry)
        except OSError as exc:
            self.degrade(f"marking the entry READY failed: {exc}")
        finally:
            self._release_fill()
        self.refresh_size(force=True)

    def abandon(self, why: str = "warmup failed") -> None:
        """The warmup failed: leave the entry without a marker (the next opener rebuilds)."""
        if self._fill is not None:
            logger.warning("%s: compile cache entry %s left without READY", why, self.entry)
        self._release_fill()

    def _release_fill(self) -> None:
        if self._fill is not None:
            self._fill.close()
            self._fill = None

    def refresh_size(self, *, force: bool = False) -> CacheInfo:
        now = time.monotonic()
        if self.entry is not None and (force or now - self._size_at > SIZE_TTL_S):
            self.info.size_bytes = cache_fs.dir_size(self.entry)
            self._size_at = now
        return self.info

    def close(self) -> None:
        self._release_fill()
        if self._use is not None:
            self._use.close()
            self._use = None


def compile_cache_of(config: Any) -> CompileCache | None:
    """The ServerConfig's cache (--cache-dir), or None when none is configured."""
    root = getattr(config, "cache_dir", None)
    if not root:
        return None
    return CompileCache(root, lock_timeout_s=getattr(config, "cache_lock_timeout_s",
                                                     CACHE_LOCK_TIMEOUT_S))
