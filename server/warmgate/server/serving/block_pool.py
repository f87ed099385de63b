"""The KV cache's free blocks, as the scheduler hands them to requests."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

# The runner's null block (runner.kv_cache.NULL_BLOCK_ID, which imports torch; this module is
# imported by the server before torch may be): padded tokens write there, no request owns it.
NULL_BLOCK_ID = 0


class BlockPool:
    """Block ids 1..num_blocks-1 (0 is the runner's null block), handed out whole or not at
    all, so a failed allocation leaves the pool as it was."""

    def __init__(self, num_blocks: int, free_ids: Iterable[int] | None = None) -> None:
        """`free_ids`: the ids to hand out, in order (default all but the null block); a tool
        that drives a runner beside another scheduler passes ids the other does not use."""
        self.num_blocks = num_blocks
        # range(), not a filtering generator: it is faster, which matters at the tens of
        # thousands of blocks of a large GPU (built before ready, but still start-up time).
        self._free: deque[int] = deque(range(NULL_BLOCK_ID + 1, num_blocks)
                                       if free_ids is None else free_ids)

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def free_ids(self) -> list[int]:
        """The free ids in the order they will be handed out."""
        return list(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """`count` blocks, or None (and nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        return [self._free.popleft() for _ in range(count)]

    def free(self, blocks: list[int]) -> None:
        # Freed blocks go to the back: a block just released is the last one reused, which
        # keeps stale KV of a preempted request away from its recompute for longest (and
        # makes use-after-free bugs show up as wrong tokens rather than hide).
        self._free.extend(blocks)
