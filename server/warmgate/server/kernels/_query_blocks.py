"""Which request and which of its query blocks a paged-attention program holds, found on the
device from query_start_loc (the varlen and fixed-split kernels).

Request r owns the programs from B_r = query_start_loc[r] // BLOCK_Q + r up to B_{r+1}: at
least cdiv(q_len_r, BLOCK_Q) of them, since floor((s + L) / B) - floor(s / B) >= floor(L / B).
B_r strictly increases with r, so a program's request is the last whose B_r is at or before
its index. num_tokens // BLOCK_Q + num_reqs programs cover any batch of num_tokens rows and
num_reqs requests. A grid of the longest query's blocks for every request is what this
replaces: a CUDA graph of a ragged bucket takes the bucket as its longest query, so at 1,152
tokens and 128 requests it launched 36 blocks a request, nearly all of them programs that only
exit, each holding an SM while it starts (on an H100, the varlen kernel's 216 registers a
thread in 8 warps leave room for one program an SM).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Requests whose first blocks a program compares at once while it looks for its own.
REQ_CHUNK = 128


def query_block_programs(num_tokens: int, num_reqs: int, block_q: int) -> int:
    """Programs along the query axis for any batch of num_tokens rows and num_reqs requests."""
    return num_tokens // block_q + num_reqs


@triton.jit
def locate_block(query_start_loc_ptr, num_reqs, program, BLOCK_Q: tl.constexpr,
                 REQ_CHUNK: tl.constexpr):
    """(request, query block within it) of program `program` along the query axis; the block
    may lie past the request's last token (the program then has nothing to do)."""
    at_or_before = tl.zeros([], dtype=tl.int32)
    for chunk in range(0, num_reqs, REQ_CHUNK):
        r = chunk + tl.arange(0, REQ_CHUNK)
        valid = r < num_reqs
        first_block = tl.load(query_start_loc_ptr + r, mask=valid, other=0) // BLOCK_Q + r
        at_or_before += tl.sum((valid & (first_block <= program)).to(tl.int32), axis=0)
    req = at_or_before - 1  # B_0 = 0: every program has a request
    return req, program - (tl.load(query_start_loc_ptr + req) // BLOCK_Q + req)
