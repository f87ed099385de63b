"""Each held request's KV block ids in a numpy row of its own, kept across steps, so a step's
block table is one gather of its requests' rows.

Building the table from every request's Python list each step (itertools.chain into numpy,
then a scatter) cost about 190 us a step at 128 requests of 48 blocks on a 2-core CPU, and on
an H100's host 6.8 % of the 1B's engine at 128 streams, where the engine's Python, not the
GPU, set the pace (bench/results/h100-pyspy-summary-llama-3.2-1b.txt). A request's blocks only
grow while it runs, so its row is written when it arrives and where its blocks grow, and a
step reads it with np.take.

RequestState.block_ids stays the record: a row whose length differs from its request's list
(a state built or changed outside InputBatch.update_states, as tests do) is written again
from the list when a step asks for it, so a row never holds other ids than the list.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from warmgate.server.runner.request_state import RequestState


class BlockRows:
    def __init__(self, max_blocks_per_req: int, capacity: int) -> None:
        self.table = np.zeros((max(capacity, 1), max_blocks_per_req), np.int32)
        self._lens: list[int] = [0] * self.table.shape[0]
        self._row: dict[str, int] = {}
        self._free = list(range(self.table.shape[0] - 1, -1, -1))

    def add(self, state: RequestState) -> None:
        """A new request's row, from its list."""
        self.drop(state.req_id)
        self._write(self._take(state.req_id), state.block_ids)

    def extend(self, req_id: str, new_blocks: Sequence[int], old_len: int) -> None:
        """Blocks appended to a held request's list, which held old_len before them."""
        row = self._row.get(req_id)
        if row is None or self._lens[row] != old_len:
            return  # rows_of writes it from the list when a step asks for it
        n = old_len + len(new_blocks)
        self.table[row, old_len:n] = new_blocks
        self._lens[row] = n

    def drop(self, req_id: str) -> None:
        row = self._row.pop(req_id, None)
        if row is not None:
            self._free.append(row)

    def rows_of(self, states: Sequence[RequestState]) -> np.ndarray:
        """[len(states)] int64, each request's row, any row that does not hold its request's
        list written from it first."""
        rows = np.empty(len(states), np.int64)
        for i, state in enumerate(states):
            row = self._row.get(state.req_id)
            if row is None:
                row = self._take(state.req_id)
                self._write(row, state.block_ids)
            elif self._lens[row] != len(state.block_ids):
                self._write(row, state.block_ids)
            rows[i] = row
        return rows

    def _take(self, req_id: str) -> int:
        if not self._free:  # more requests held than rows: twice the rows
            old = self.table.shape[0]
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self._lens += [0] * old
            self._free = list(range(2 * old - 1, old - 1, -1))
        row = self._free.pop()
        self._row[req_id] = row
        return row

    def _write(self, row: int, block_ids: Sequence[int]) -> None:
        n = len(block_ids)
        self.table[row, n:self._lens[row]] = 0  # a reused row's longer past: no stale ids
        self.table[row, :n] = block_ids
        self._lens[row] = n
