"""runner/block_rows.py: a step's block table gathered from rows kept across steps equals the
one built from the requests' lists, through arrivals, growth, finishes, reused rows, more
requests than rows, and lists changed behind its back."""

from __future__ import annotations

import random

import numpy as np

from warmgate.server.runner.block_rows import BlockRows
from warmgate.server.runner.request_state import RequestState

MAX_BLOCKS = 12


def _state(rid: str, blocks: list[int]) -> RequestState:
    return RequestState(rid, [1, 2, 3], None, list(blocks), 0)


def _table_from_lists(states: list[RequestState]) -> np.ndarray:
    """The table as the lists say: each request's ids, zeros after them."""
    table = np.zeros((len(states), MAX_BLOCKS), np.int32)
    for i, s in enumerate(states):
        table[i, :len(s.block_ids)] = s.block_ids
    return table


def _gathered(rows: BlockRows, states: list[RequestState]) -> np.ndarray:
    return rows.table[rows.rows_of(states)]


def test_rows_follow_arrivals_growth_and_finishes_with_rows_reused() -> None:
    rng = random.Random(0)
    rows = BlockRows(MAX_BLOCKS, capacity=4)  # fewer rows than requests held at times
    held: dict[str, RequestState] = {}
    next_block = 1
    for step in range(300):
        if held and rng.random() < 0.3:  # a request finishes; its row goes back
            rid = rng.choice(sorted(held))
            rows.drop(rid)
            del held[rid]
        if len(held) < 7 and rng.random() < 0.5:  # one arrives with a few blocks
            n = rng.randint(1, 4)
            state = _state(f"r{step}", list(range(next_block, next_block + n)))
            next_block += n
            held[state.req_id] = state
            rows.add(state)
        for state in held.values():  # some grow
            if len(state.block_ids) < MAX_BLOCKS and rng.random() < 0.4:
                new = [next_block]
                next_block += 1
                rows.extend(state.req_id, new, len(state.block_ids))
                state.block_ids.extend(new)
        states = list(held.values())
        rng.shuffle(states)  # a step's order is the scheduler's, not the rows'
        assert np.array_equal(_gathered(rows, states), _table_from_lists(states))


def test_a_list_changed_outside_is_written_again() -> None:
    rows = BlockRows(MAX_BLOCKS, capacity=2)
    a, b = _state("a", [5, 6, 7]), _state("b", [8])
    rows.add(a)
    a.block_ids[:] = [9]  # shorter, behind the rows' back
    b.block_ids.append(10)  # never added at all
    assert np.array_equal(_gathered(rows, [a, b]), _table_from_lists([a, b]))
    rows.extend("a", [11], old_len=5)  # a stale length: ignored, the list stays the record
    a.block_ids.append(11)
    assert np.array_equal(_gathered(rows, [b, a]), _table_from_lists([b, a]))
