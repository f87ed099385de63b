"""Per-request state and the flattening of a SchedulerOutput into one step's device inputs.

Inputs are assembled on the host in one pinned buffer, laid out for the step's padded shape
(runner/step_staging.py: the shape of the CUDA graph it replays, or of its eager forward),
padding included, and sent to the device in one copy; the metadata tensors are views of that
buffer's device twin, at addresses fixed per shape, so a graph captured for a shape reads the
next batch of that shape where it was captured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from warmgate.server.runner.attention.base import AttentionMetadata
from warmgate.server.runner.batch import is_uniform_decode
from warmgate.server.runner.block_rows import BlockRows
from warmgate.server.runner.request_state import PLACEHOLDER, RequestState, ScheduledRequest
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams, SchedulerOutput
from warmgate.server.runner.step_shape import EAGER, UNIFORM, StepShape
from warmgate.server.runner.step_staging import StepStaging, StepViews

# The padded shape for a step of (requests, tokens, uniform decode): the runner's choice.
ShapeFor = Callable[[int, int, bool], StepShape]


@dataclass
class StepInputs:
    scheduled: list[ScheduledRequest]
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_logits_rows] int64, rows of the step's hidden states
    logits_req_ids: list[str]  # [num_logits_rows], the request each logits row belongs to
    # What the step was padded to, and its regions at that shape (the real rows first).
    shape: StepShape
    views: StepViews
    # Every request still reading its prompt (batch.is_prefilling): a PREFILL batch.
    all_prefill: bool = False
    # Input rows whose token is still on the device (views.pending: these rows, then each
    # one's row of the device's tokens).
    num_pending: int = 0

    @property
    def req_ids(self) -> list[str]:
        return [s.req_id for s in self.scheduled]


class InputBatch:
    def __init__(self, max_num_reqs: int, max_num_tokens: int, max_blocks_per_req: int,
                 block_size: int, decode_query_len: int, device: torch.device,
                 default_sampling_params: SamplingParams | None = GREEDY) -> None:
        self.block_size = block_size
        self.decode_query_len = decode_query_len
        self.device = device
        self.default_sampling_params = default_sampling_params
        self.requests: dict[str, RequestState] = {}
        self.staging = StepStaging(max_num_tokens, max_num_reqs, max_blocks_per_req, device)
        self.block_rows = BlockRows(max_blocks_per_req, max_num_reqs)
        # The pinned host buffer is refilled every step: wait until the last step's
        # non-blocking copy has left it.
        self._copies_done = torch.cuda.Event() if device.type == "cuda" else None

    @property
    def max_num_reqs(self) -> int:
        return self.staging.max_num_reqs

    @property
    def max_num_tokens(self) -> int:
        return self.staging.max_num_tokens

    def stage_empty(self, shape: StepShape) -> StepViews:
        """A graph shape's regions holding no request at all, only padding, sent to the
        device: what a graph is captured (and first replayed) on."""
        self._wait_for_last_copy()
        views = self.staging.views(shape.num_tokens, shape.num_reqs)
        views.query_start_loc.np[0] = 0
        self._pad(views, shape, 0, 0)
        self._send(views)
        return views

    def update_states(self, so: SchedulerOutput) -> list[ScheduledRequest]:
        """Apply a validated SchedulerOutput; returns the step's requests in schedule order."""
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
            self.block_rows.drop(rid)
        computed: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            params = new.sampling_params or self.default_sampling_params
            state = RequestState(
                req_id=new.req_id, prompt_token_ids=list(new.prompt_token_ids),
                sampling_params=params, block_ids=list(new.block_ids[0]),
                num_computed_tokens=new.num_computed_tokens,
                output_token_ids=list(new.output_token_ids))
            self.requests[new.req_id] = state
            self.block_rows.add(state)
            computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        requests = self.requests
        for rid, new_blocks, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                 cached.num_computed_tokens, strict=True):
            if new_blocks is not None:
                state = requests[rid]
                self.block_rows.extend(rid, new_blocks[0], len(state.block_ids))
                state.block_ids.extend(new_blocks[0])
            computed[rid] = num_computed
        drafts = so.scheduled_spec_decode_tokens
        scheduled = []
        for rid, n in so.num_scheduled_tokens.items():
            state, start = requests[rid], computed[rid]
            scheduled.append(ScheduledRequest(state, start, n,
                                              tuple(drafts[rid]) if rid in drafts else ()))
            # The runner's own count after this step; the scheduler restates it when it
            # differs (rejected drafts), and it is what the next step starts from if not.
            state.num_computed_tokens = start + n
        return scheduled

    def prepare_inputs(self, scheduled: list[ScheduledRequest],
                       shape_for: ShapeFor | None = None) -> StepInputs:
        """Fill the host buffer for this step at the padded shape shape_for picks (exact
        when None), then send it to the device in one copy. One pass over the step's requests
        gathers their numbers; everything per token is numpy."""
        self._wait_for_last_copy()
        num_reqs = len(scheduled)
        query_lens = np.fromiter((s.num_scheduled_tokens for s in scheduled), np.int64, num_reqs)
        computed = np.fromiter((s.num_computed_tokens for s in scheduled), np.int64, num_reqs)
        prompt_lens = np.fromiter((len(s.state.prompt_token_ids) for s in scheduled), np.int64,
                                  num_reqs)
        num_tokens, max_query_len = int(query_lens.sum()), int(query_lens.max())
        prefilling = computed < prompt_lens  # batch.is_prefilling, per request
        uniform = is_uniform_decode(num_tokens, num_reqs, max_query_len, self.decode_query_len,
                                    any_prefill=bool(prefilling.any()))
        shape = (StepShape(EAGER, num_tokens, num_reqs) if shape_for is None
                 else shape_for(num_reqs, num_tokens, uniform))
        views = self.staging.views(shape.num_tokens, shape.num_reqs)
        positions = self._fill_positions(views, query_lens, computed)
        self._fill_slot_mapping(views, scheduled, query_lens, positions)
        rows, row_req_ids = self._fill_token_ids(views, scheduled)
        num_pending = _fill_pending(views, scheduled, num_tokens)
        self._pad(views, shape, num_reqs, num_tokens)
        self._send(views)
        meta = AttentionMetadata(
            num_reqs=num_reqs, num_tokens=num_tokens, max_query_len=max_query_len,
            max_seq_len=int((computed + query_lens).max()),
            query_start_loc=_head(views.query_start_loc.gpu, num_reqs + 1),
            seq_lens=_head(views.seq_lens.gpu, num_reqs),
            block_table=_head(views.block_table.gpu, num_reqs),
            slot_mapping=_head(views.slot_mapping.gpu, num_tokens),
            positions=_head(views.positions.gpu, num_tokens),
            query_start_loc_cpu=_head(views.query_start_loc.cpu, num_reqs + 1),
            seq_lens_cpu=_head(views.seq_lens.cpu, num_reqs),
            block_table_cpu=_head(views.block_table.cpu, num_reqs),
            is_uniform_decode=uniform)
        return StepInputs(scheduled=scheduled,
                          input_ids=_head(views.input_ids.gpu, num_tokens),
                          positions=meta.positions, meta=meta,
                          logits_indices=views.logits_indices.gpu[:rows],
                          logits_req_ids=row_req_ids, shape=shape, views=views,
                          all_prefill=bool(prefilling.all()), num_pending=num_pending)

    def _wait_for_last_copy(self) -> None:
        if self._copies_done is not None:
            self._copies_done.synchronize()

    def _send(self, views: StepViews) -> None:
        self.staging.send(views)
        if self._copies_done is not None:
            self._copies_done.record()

    def _pad(self, views: StepViews, shape: StepShape, num_reqs: int, num_tokens: int) -> None:
        """Rows past the step's own as the shape's padding: tokens that no request owns
        (token 0 at position 0, written to slot 0 of the null block), and requests on the
        null block (a zero block table row; stale ids would name live blocks) that decode
        decode_query_len tokens in a uniform-decode graph and none in a ragged one."""
        if shape.num_tokens > num_tokens:
            for region in (views.input_ids, views.positions, views.slot_mapping):
                region.np[num_tokens:] = 0
        if shape.num_reqs > num_reqs:
            views.block_table.np[num_reqs:] = 0
            if shape.kind == UNIFORM:
                q = self.decode_query_len
                views.seq_lens.np[num_reqs:] = q
                views.query_start_loc.np[num_reqs + 1:] = np.arange(
                    num_reqs + 1, shape.num_reqs + 1) * q
            else:
                views.seq_lens.np[num_reqs:] = 0
                views.query_start_loc.np[num_reqs + 1:] = num_tokens

    def _fill_positions(self, views: StepViews, query_lens: np.ndarray, computed: np.ndarray
                        ) -> np.ndarray:
        """query_start_loc, seq_lens and every token's position: its request's first query
        position plus its offset in the request's query."""
        num_reqs, num_tokens = len(query_lens), int(query_lens.sum())
        qsl = views.query_start_loc.np
        qsl[0] = 0
        qsl[1:num_reqs + 1] = np.cumsum(query_lens)
        views.seq_lens.np[:num_reqs] = computed + query_lens
        positions = (np.arange(num_tokens) - np.repeat(qsl[:num_reqs], query_lens)
                     + np.repeat(computed, query_lens))
        views.positions.np[:num_tokens] = positions
        return positions

    def _fill_slot_mapping(self, views: StepViews, scheduled: list[ScheduledRequest],
                           query_lens: np.ndarray, positions: np.ndarray) -> None:
        """The block table (the requests' rows of block_rows gathered in one numpy take), and
        the KV slot each token writes to."""
        num_reqs = len(scheduled)
        table = views.block_table.np
        rows = self.block_rows.rows_of([s.state for s in scheduled])
        # Zeros past each request's blocks: stale ids would point at live blocks.
        np.take(self.block_rows.table, rows, axis=0, out=table[:num_reqs])
        token_req = np.repeat(np.arange(num_reqs), query_lens)  # [T]
        block_idx = positions // self.block_size
        views.slot_mapping.np[:len(positions)] = (
            table[token_req, block_idx].astype(np.int64) * self.block_size
            + positions % self.block_size)

    def _fill_token_ids(self, views: StepViews, scheduled: list[ScheduledRequest]
                        ) -> tuple[int, list[str]]:
        """Input token ids (drafts last in each request) and the hidden-state rows that need
        logits (each request's last num_logits_rows query rows); returns the number of those
        rows and the request of each."""
        ids: list[int] = []
        row_req_ids: list[str] = []
        for s in scheduled:
            num_inputs = s.num_scheduled_tokens - len(s.draft_token_ids)
            if num_inputs == 1:  # a decode: its one token, no list made
                ids.append(s.state.input_token(s.num_computed_tokens))
            else:
                ids += s.state.input_token_ids(s.num_computed_tokens, num_inputs)
            if s.draft_token_ids:
                ids += s.draft_token_ids
            if s.num_logits_rows == 1:
                row_req_ids.append(s.state.req_id)
            elif s.num_logits_rows:
                row_req_ids += [s.state.req_id] * s.num_logits_rows
        num_reqs = len(scheduled)
        num_rows = np.fromiter((s.num_logits_rows for s in scheduled), np.int64, num_reqs)
        ends = views.query_start_loc.np[1:num_reqs + 1].astype(np.int64)
        total = int(num_rows.sum())
        # Row j of request i: ends[i] - num_rows[i] + (j's offset among i's rows).
        offsets = np.arange(total) - np.repeat(np.cumsum(num_rows) - num_rows, num_rows)
        views.logits_indices.np[:total] = np.repeat(ends - num_rows, num_rows) + offsets
        views.input_ids.np[:len(ids)] = ids
        return total, row_req_ids


def padded_tokens(inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """An eager step's token ids, positions and metadata over its padded token count: its own
    tokens first, then padding tokens that no request owns (query_start_loc still ends at the
    step's own count, so attention leaves their rows alone; every other op is row-wise)."""
    meta, views = inputs.meta, inputs.views
    if inputs.shape.num_tokens == meta.num_tokens:
        return inputs.input_ids, inputs.positions, meta
    return (views.input_ids.gpu, views.positions.gpu,
            replace(meta, num_tokens=inputs.shape.num_tokens, positions=views.positions.gpu,
                    slot_mapping=views.slot_mapping.gpu))


def _fill_pending(views: StepViews, scheduled: list[ScheduledRequest], num_tokens: int) -> int:
    """The input rows holding a placeholder (a request whose newest token the host does not
    have yet: runner/async_output.py) and, after them, each one's row of the device's last
    tokens; returns how many."""
    rows = np.flatnonzero(views.input_ids.np[:num_tokens] == PLACEHOLDER)
    n = int(rows.size)
    if n:
        # Only the newest token can be pending, the request's one input then (a pending
        # request gets neither drafts nor a prompt chunk).
        ends = views.query_start_loc.np[1:len(scheduled) + 1]
        owners = np.searchsorted(ends, rows, side="right").tolist()
        pending, cap = views.pending.np, views.num_reqs
        pending[:n] = rows
        pending[cap:cap + n] = [scheduled[i].state.device_row for i in owners]
    return n


def _head(tensor: torch.Tensor, n: int) -> torch.Tensor:
    """The first n rows (the tensor itself when it has n: no view to make)."""
    return tensor if tensor.shape[0] == n else tensor[:n]
