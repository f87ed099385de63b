"""Fixed-split attention test steps: a request's keys, values and queries for every position,
laid into a fresh paged cache per step, so one token can be computed in any batch, under any
cut of its prompt into steps, and compared bit for bit; plus a float64 reference.

Every cache slot nobody wrote is NaN (a kernel that reads past a request's keys shows it);
block 0 is the null block, zeros, where graph-padding requests point."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from warmgate.server.kernels.fixed_split_attention import paged_attention_fixed_split

NAN = float("nan")
BLOCK_SIZE = 4  # pages shorter than a key tile, so tiles span pages


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Request:
    keys: torch.Tensor  # [L, Hk, D]
    values: torch.Tensor  # [L, Hk, D]
    queries: torch.Tensor  # [L, Hq, D]: the query of the token at each position

    @property
    def length(self) -> int:
        return self.keys.shape[0]


@dataclass(frozen=True)
class Part:
    """One request's share of a step: queries at positions start .. start + q_len - 1 over the
    keys 0 .. start + q_len - 1. request None: graph padding on the null block (start = -q_len
    gives seq_len 0, nothing to attend to)."""

    request: Request | None
    start: int
    q_len: int

    @property
    def seq_len(self) -> int:
        return self.start + self.q_len


def make_request(seed: int, length: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: str) -> Request:
    gen = torch.Generator().manual_seed(seed)

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(length, heads, head_dim, generator=gen).to(device, dtype)

    return Request(keys=draw(num_kv_heads), values=draw(num_kv_heads), queries=draw(num_heads))


def run_step(parts: Sequence[Part], *, split_keys: int, split_programs: int,
             table_width: int, seed: int, num_heads: int, num_kv_heads: int, head_dim: int,
             dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    """One kernel launch over `parts` (pages shuffled by `seed`); each part's output rows."""
    gen = torch.Generator().manual_seed(seed)
    pages_needed = [cdiv(max(p.seq_len, 0), BLOCK_SIZE) if p.request else 0 for p in parts]
    num_blocks = 1 + sum(pages_needed) + 2
    pages = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    kv_cache = torch.full((2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), NAN,
                          dtype=dtype, device=device)
    kv_cache[:, 0] = 0.0  # the null block: padded tokens write there on the graph path
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
    table = torch.zeros(len(parts), table_width, dtype=torch.int32)
    queries = []
    used = 0
    for i, (part, n_pages) in enumerate(zip(parts, pages_needed, strict=True)):
        req_pages = torch.tensor(pages[used:used + n_pages], dtype=torch.int64)
        used += n_pages
        table[i, :n_pages] = req_pages.to(torch.int32)
        if part.request is None:
            queries.append(torch.randn(part.q_len, num_heads, head_dim,
                                       generator=gen).to(device, dtype))
            continue
        pos = torch.arange(part.seq_len)
        slots = (req_pages[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE).to(device)
        flat[0, slots] = part.request.keys[:part.seq_len]
        flat[1, slots] = part.request.values[:part.seq_len]
        queries.append(part.request.queries[part.start:part.seq_len])
    q = torch.cat(queries)
    starts = torch.zeros(len(parts) + 1, dtype=torch.int32)
    starts[1:] = torch.tensor([p.q_len for p in parts], dtype=torch.int32).cumsum(0)
    seq_lens = torch.tensor([max(p.seq_len, 0) for p in parts], dtype=torch.int32)
    out = paged_attention_fixed_split(
        q, kv_cache, table.to(device), seq_lens.to(device), starts.to(device),
        scale=head_dim ** -0.5, max_query_len=max(p.q_len for p in parts),
        split_keys=split_keys, split_programs=split_programs, out=torch.full_like(q, NAN))
    return list(out.split([p.q_len for p in parts]))


def reference_rows(request: Request, start: int, q_len: int) -> torch.Tensor:
    """Causal attention of positions start .. start + q_len - 1 in float64, [q_len, Hq, D]."""
    seq_len = start + q_len
    keys, values = request.keys[:seq_len].double(), request.values[:seq_len].double()
    group = request.queries.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    q = request.queries[start:seq_len].double()  # [n, Hq, D]
    scores = torch.einsum("nhd,lhd->hnl", q, keys) * q.shape[-1] ** -0.5
    q_pos = torch.arange(start, seq_len, device=q.device)
    k_pos = torch.arange(seq_len, device=q.device)
    scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), values)
