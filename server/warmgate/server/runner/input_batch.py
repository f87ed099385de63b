"""Per-request state and the flattening of a SchedulerOutput into one step's device inputs.

Inputs are assembled on the host in persistent max-size numpy-backed buffers, then copied
with one host->device copy per tensor into persistent device buffers; the metadata tensors are
views of those device buffers, so a CUDA-graph runner can later capture against the same
storage and replay after padding it in place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from warmgate.server.runner.attention.base import AttentionMetadata
from warmgate.server.runner.batch import is_uniform_decode
from warmgate.server.runner.block_rows import BlockRows
from warmgate.server.runner.request_state import RequestState, ScheduledRequest
from warmgate.server.runner.scheduler_output import GREEDY, SamplingParams, SchedulerOutput


class StaticBuffer:
    """A host tensor (pinned on CUDA) with a numpy view for filling, and its device twin."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.cpu = torch.zeros(shape, dtype=dtype, pin_memory=pin)
        self.np = self.cpu.numpy()
        self.gpu = torch.zeros(shape, dtype=dtype, device=device)

    def copy_to_device(self, n: int) -> torch.Tensor:
        """Copy the first n rows over and return the device view of them."""
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


@dataclass
class StepInputs:
    scheduled: list[ScheduledRequest]
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_logits_rows] int64, rows of the step's hidden states
    logits_req_ids: list[str]  # [num_logits_rows], the request each logits row belongs to
    # Every request still reading its prompt (batch.is_prefilling): a PREFILL batch.
    all_prefill: bool = False

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
        self.input_ids = StaticBuffer((max_num_tokens,), torch.int64, device)
        self.positions = StaticBuffer((max_num_tokens,), torch.int64, device)
        self.query_start_loc = StaticBuffer((max_num_reqs + 1,), torch.int32, device)
        self.seq_lens = StaticBuffer((max_num_reqs,), torch.int32, device)
        self.block_table = StaticBuffer((max_num_reqs, max_blocks_per_req), torch.int32, device)
        self.block_rows = BlockRows(max_blocks_per_req, max_num_reqs)
        self.slot_mapping = StaticBuffer((max_num_tokens,), torch.int64, device)
        self.logits_indices = StaticBuffer((max_num_tokens,), torch.int64, device)
        # The pinned host buffers are refilled every step: wait until the last step's
        # non-blocking copies have left them.
        self._copies_done = torch.cuda.Event() if device.type == "cuda" else None

    def zero_tokens(self, start: int, end: int) -> None:
        """Device rows start..end as padding tokens: token 0 at position 0, written to slot 0
        of the null block (no request reads it)."""
        self.input_ids.gpu[start:end].zero_()
        self.positions.gpu[start:end].zero_()
        self.slot_mapping.gpu[start:end].zero_()

    def padded(self, meta: AttentionMetadata, num_tokens: int
               ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """This step's inputs and metadata over num_tokens rows: its own tokens first, then
        padding tokens that no request owns (query_start_loc still ends at the step's own
        count, so attention leaves their rows alone; every other op is row-wise)."""
        self.zero_tokens(meta.num_tokens, num_tokens)
        positions = self.positions.gpu[:num_tokens]
        return (self.input_ids.gpu[:num_tokens], positions,
                replace(meta, num_tokens=num_tokens, positions=positions,
                        slot_mapping=self.slot_mapping.gpu[:num_tokens]))

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
        for rid, new_blocks, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                 cached.num_computed_tokens, strict=True):
            state = self.requests[rid]
            if new_blocks is not None:
                self.block_rows.extend(rid, new_blocks[0], len(state.block_ids))
                state.block_ids.extend(new_blocks[0])
            state.num_computed_tokens = num_computed
            computed[rid] = num_computed
        drafts = so.scheduled_spec_decode_tokens
        scheduled = [ScheduledRequest(state=self.requests[rid], num_computed_tokens=computed[rid],
                                      num_scheduled_tokens=n,
                                      draft_token_ids=tuple(drafts.get(rid, ())))
                     for rid, n in so.num_scheduled_tokens.items()]
        # The runner's own count after this step; the scheduler restates it when it differs
        # (rejected drafts), and it is what the next step starts from if it does not.
        for s in scheduled:
            s.state.num_computed_tokens = s.seq_len
        return scheduled

    def prepare_inputs(self, scheduled: list[ScheduledRequest]) -> StepInputs:
        """Fill the host buffers for this step, then copy each to the device once. One pass
        over the step's requests gathers their numbers; everything per token is numpy."""
        if self._copies_done is not None:
            self._copies_done.synchronize()
        num_reqs = len(scheduled)
        query_lens = np.fromiter((s.num_scheduled_tokens for s in scheduled), np.int64, num_reqs)
        computed = np.fromiter((s.num_computed_tokens for s in scheduled), np.int64, num_reqs)
        prompt_lens = np.fromiter((len(s.state.prompt_token_ids) for s in scheduled), np.int64,
                                  num_reqs)
        positions = self._fill_positions(query_lens, computed)
        self._fill_slot_mapping(scheduled, query_lens, positions)
        rows, row_req_ids = self._fill_token_ids(scheduled)
        prefilling = computed < prompt_lens  # batch.is_prefilling, per request
        meta = self._metadata(num_reqs, query_lens, computed, any_prefill=bool(prefilling.any()))
        inputs = StepInputs(scheduled=scheduled,
                            input_ids=self.input_ids.copy_to_device(meta.num_tokens),
                            positions=meta.positions, meta=meta,
                            logits_indices=self.logits_indices.copy_to_device(rows),
                            logits_req_ids=row_req_ids,
                            all_prefill=bool(prefilling.all()))
        if self._copies_done is not None:
            self._copies_done.record()
        return inputs

    def _fill_positions(self, query_lens: np.ndarray, computed: np.ndarray) -> np.ndarray:
        """query_start_loc, seq_lens and every token's position: its request's first query
        position plus its offset in the request's query."""
        num_reqs, num_tokens = len(query_lens), int(query_lens.sum())
        qsl = self.query_start_loc.np
        qsl[0] = 0
        qsl[1:num_reqs + 1] = np.cumsum(query_lens)
        self.seq_lens.np[:num_reqs] = computed + query_lens
        positions = (np.arange(num_tokens) - np.repeat(qsl[:num_reqs], query_lens)
                     + np.repeat(computed, query_lens))
        self.positions.np[:num_tokens] = positions
        return positions

    def _fill_slot_mapping(self, scheduled: list[ScheduledRequest], query_lens: np.ndarray,
                           positions: np.ndarray) -> None:
        """The block table (the requests' rows of block_rows gathered in one numpy take), and
        the KV slot each token writes to."""
        num_reqs = len(scheduled)
        table = self.block_table.np
        rows = self.block_rows.rows_of([s.state for s in scheduled])
        # Zeros past each request's blocks: stale ids would point at live blocks.
        np.take(self.block_rows.table, rows, axis=0, out=table[:num_reqs])
        token_req = np.repeat(np.arange(num_reqs), query_lens)  # [T]
        block_idx = positions // self.block_size
        self.slot_mapping.np[:len(positions)] = (table[token_req, block_idx].astype(np.int64)
                                                 * self.block_size + positions % self.block_size)

    def _fill_token_ids(self, scheduled: list[ScheduledRequest]) -> tuple[int, list[str]]:
        """Input token ids (drafts last in each request) and the hidden-state rows that need
        logits (each request's last num_logits_rows query rows); returns the number of those
        rows and the request of each."""
        ids: list[int] = []
        row_req_ids: list[str] = []
        for s in scheduled:
            ids += s.state.input_token_ids(s.num_computed_tokens,
                                           s.num_scheduled_tokens - len(s.draft_token_ids))
            ids += s.draft_token_ids
            if s.num_logits_rows == 1:
                row_req_ids.append(s.state.req_id)
            elif s.num_logits_rows:
                row_req_ids += [s.state.req_id] * s.num_logits_rows
        num_reqs = len(scheduled)
        num_rows = np.fromiter((s.num_logits_rows for s in scheduled), np.int64, num_reqs)
        ends = self.query_start_loc.np[1:num_reqs + 1].astype(np.int64)
        total = int(num_rows.sum())
        # Row j of request i: ends[i] - num_rows[i] + (j's offset among i's rows).
        offsets = np.arange(total) - np.repeat(np.cumsum(num_rows) - num_rows, num_rows)
        self.logits_indices.np[:total] = np.repeat(ends - num_rows, num_rows) + offsets
        self.input_ids.np[:len(ids)] = ids
        return total, row_req_ids

    def _metadata(self, num_reqs: int, query_lens: np.ndarray, computed: np.ndarray, *,
                  any_prefill: bool) -> AttentionMetadata:
        """Attention metadata over device views of the filled buffers (copied here)."""
        num_tokens = int(query_lens.sum())
        max_query_len = int(query_lens.max())
        return AttentionMetadata(
            num_reqs=num_reqs, num_tokens=num_tokens, max_query_len=max_query_len,
            max_seq_len=int((computed + query_lens).max()),
            query_start_loc=self.query_start_loc.copy_to_device(num_reqs + 1),
            seq_lens=self.seq_lens.copy_to_device(num_reqs),
            block_table=self.block_table.copy_to_device(num_reqs),
            slot_mapping=self.slot_mapping.copy_to_device(num_tokens),
            positions=self.positions.copy_to_device(num_tokens),
            query_start_loc_cpu=self.query_start_loc.cpu[:num_reqs + 1],
            seq_lens_cpu=self.seq_lens.cpu[:num_reqs],
            block_table_cpu=self.block_table.cpu[:num_reqs],
            is_uniform_decode=is_uniform_decode(num_tokens, num_reqs, max_query_len,
                                                self.decode_query_len, any_prefill=any_prefill))
