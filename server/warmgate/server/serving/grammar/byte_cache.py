"""Compiled grammars by spec, least recently used dropped first, bounded by bytes.

A count bound let each of 256 entries hold a 55 MB grammar (a 12 KB schema of patterned
properties on SmolLM2's vocabulary): about 14 GB. Each entry is charged xgrammar's
memory_size_bytes times RSS_PER_REPORTED_BYTE, so that the budget bounds the resident memory
the cache holds rather than xgrammar's estimate: 12 distinct 10 MB grammars compiled in a row
under a 40 MiB budget grew the RSS by 1.3 bytes per reported byte held, creeping up with
each eviction (the allocator kept the freed pages); 1.5 leaves room for that. After evicting,
the freed pages go back to the system (trim_heap), which kept the RSS flat.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
RSS_PER_REPORTED_BYTE = 1.5


class ByteBoundedCache(Generic[K, V]):
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def charge(memory_bytes: int) -> int:
        return int(memory_bytes * RSS_PER_REPORTED_BYTE)

    def get(self, key: K) -> V | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            self._entries.move_to_end(key)
            return hit[0]

    def make_room(self, memory_bytes: int) -> int:
        """Drop least recently used entries until one of `memory_bytes` fits: before it is
        built, so that the cache and the grammar being built stay within the budget
        together. The number of entries dropped."""
        cost = self.charge(memory_bytes)
        with self._lock:
            return self._evict_for(cost)

    def _evict_for(self, cost: int) -> int:
        dropped = 0
        while self._entries and self._bytes + cost > self.budget_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self._bytes -= freed
            dropped += 1
        return dropped

    def put(self, key: K, value: V, memory_bytes: int) -> bool:
        """Keep `value`, dropping the least recently used entries to make room; False (and
        nothing kept or dropped) when it alone is over the budget."""
        cost = self.charge(memory_bytes)
        if cost > self.budget_bytes:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._evict_for(cost)
            self._entries[key] = (value, cost)
            self._bytes += cost
            return True

    @property
    def num_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _libc_malloc_trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc: nothing to trim with
        return None


_MALLOC_TRIM = _libc_malloc_trim()


def trim_heap() -> None:
    """Hand the pages of dropped grammars back to the system (glibc's malloc_trim), so the
    RSS shows what the cache holds; a no-op elsewhere."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
