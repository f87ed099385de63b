"""--deterministic's fixed-split attention (kernels/fixed_split_attention.py) against the default
kernels on the GPU, in CUDA graphs (the way the server runs it: no launch overhead).

Decode table, per (batch, context): the default decode kernel (split-K by choose_num_splits),
the varlen kernel (what --deterministic ran before the fixed split: no key split), and the
fixed-split kernel at each split size C, walked in one program (a) and run apart with the merge
(b: the plan's program count); us per call and the plan's way over the default. Prefill
table, per prompt length: varlen against the fixed split (a) at each C. Then the checks: (a)
and (b) the same bits, and a token's row the same bits in a whole prefill, a decode and a
verification.

Each graph calls the kernel once per "layer", each layer reading its own pages of one cache,
so the K/V bytes cross HBM (the working set is many times the L2) as a model's layers would.

    python bench/lib/fixed_split_attention_gpu.py [--model llama-3.2-1b|llama-3.1-8b]
        [--capacity 8192] [--split-keys 128,256,512,1024]
"""

from __future__ import annotations

import argparse

import torch
from graph_timing import graph_us

from warmgate.server.kernels import choose_num_splits, paged_attention_decode
from warmgate.server.kernels.fixed_split_attention import (
    key_tile,
    paged_attention_fixed_split,
    query_programs,
    split_bytes,
)
from warmgate.server.kernels.fixed_split_plan import FixedSplitPlan, fixed_split_plan
from warmgate.server.kernels.matmul_plan import device_sm_count
from warmgate.server.kernels.varlen_attention import paged_attention_varlen

# (query heads, KV heads, head dim)
MODELS = {"llama-3.2-1b": (32, 8, 64), "llama-3.1-8b": (32, 8, 128)}
BLOCK_SIZE = 16
BATCHES = (1, 8, 32, 64)
CONTEXTS = (512, 2048, 8192)
PROMPTS = (512, 2048, 8192)
MIN_WORKING_SET = 512 << 20
MAX_LAYERS = 256


class Setup:
    """A paged cache of `layers` x `batch` requests of `context` keys, pages shuffled."""

    def __init__(self, heads: tuple[int, int, int], batch: int, context: int,
                 capacity: int, layers: int, query_len: int = 1,
                 device: str = "cuda") -> None:
        hq, hk, d = heads
        dev = torch.device(device)
        per_req = -(-context // BLOCK_SIZE)
        num_blocks = 1 + layers * batch * per_req
        self.kv_cache = torch.empty(2, num_blocks, BLOCK_SIZE, hk, d, device=dev,
                                    dtype=torch.bfloat16).normal_()
        pages = torch.randperm(num_blocks - 1, device=dev).to(torch.int32) + 1
        width = capacity // BLOCK_SIZE
        self.tables = torch.zeros(layers, batch, width, dtype=torch.int32, device=dev)
        self.tables[:, :, :per_req] = pages.view(layers, batch, per_req)
        self.seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
        self.qsl = torch.arange(batch + 1, dtype=torch.int32, device=dev) * query_len
        self.q = torch.randn(batch * query_len, hq, d, device=dev, dtype=torch.bfloat16)
        self.out = torch.empty_like(self.q)
        self.scale = d ** -0.5
        self.query_len = query_len
        self.layers = layers


def layers_for(batch: int, context: int, hk: int, d: int) -> int:
    kv_bytes = 2 * batch * context * hk * d * 2
    return max(2, min(MAX_LAYERS, -(-MIN_WORKING_SET // kv_bytes)))


def fixed(s: Setup, layer: int, split_keys: int, programs: int) -> torch.Tensor:
    return paged_attention_fixed_split(
        s.q, s.kv_cache, s.tables[layer], s.seq_lens, s.qsl, scale=s.scale,
        max_query_len=s.query_len, split_keys=split_keys, split_programs=programs, out=s.out)


def decode_table(heads: tuple[int, int, int], capacity: int, split_keys: list[int]) -> None:
    hq, hk, d = heads
    sms = device_sm_count(torch.device("cuda"))
    print(f"\ndecode, us per call: default decode kernel, varlen, then per C the fixed split "
          f"walked (a) / apart (b, the plan's programs); capacity {capacity}, {sms} SMs")
    print(f"{'batch':>5}{'ctx':>6}{'default':>9}{'varlen':>8}"
          + "".join(f"{f'C={c} a/b(P)':>22}" for c in split_keys) + f"{'plan/def':>9}")
    plan_c = fixed_split_plan(capacity, key_tile(d, torch.bfloat16, True)).split_keys
    for context in (c for c in CONTEXTS if c <= capacity):
        for batch in BATCHES:
            s = Setup(heads, batch, context, capacity, layers_for(batch, context, hk, d))
            splits = choose_num_splits(batch, hk, capacity, sms)
            default = graph_us(lambda i, s=s, n=splits: paged_attention_decode(
                s.q, s.kv_cache, s.tables[i], s.seq_lens, s.qsl, scale=s.scale, query_len=1,
                num_splits=n, out=s.out), s.layers)
            varlen = graph_us(lambda i, s=s: paged_attention_varlen(
                s.q, s.kv_cache, s.tables[i], s.seq_lens, s.qsl, scale=s.scale,
                max_query_len=1, out=s.out), s.layers)
            cells, plan_us = [], float("nan")
            for c in split_keys:
                plan = FixedSplitPlan(split_keys=c, max_splits=-(-capacity // c))
                programs = plan.programs(
                    hk * query_programs(batch, batch, hq // hk, d, torch.bfloat16, True), sms,
                    split_bytes(batch, hq, d))
                walked = graph_us(lambda i, s=s, c=c: fixed(s, i, c, 1), s.layers)
                apart = graph_us(lambda i, s=s, c=c, n=programs: fixed(s, i, c, n), s.layers)
                cells.append(f"{walked:>9.1f}/{apart:>7.1f}({programs:>3})")
                if c == plan_c:
                    plan_us = apart if programs > 1 else walked
            print(f"{batch:>5}{context:>6}{default:>9.1f}{varlen:>8.1f}" + "".join(
                f"{cell:>22}" for cell in cells) + f"{plan_us / default:>9.2f}")
            del s
            torch.cuda.empty_cache()


def programs_table(heads: tuple[int, int, int], capacity: int, split_keys: int) -> None:
    """Way (b) at the plan's C with 1..max_splits programs per (request, KV head): whether its
    cost follows the splits that hold keys or the programs launched (most of which find no
    keys at a short context, and whose partials the fold kernel never reads)."""
    _, hk, d = heads
    max_splits = -(-capacity // split_keys)
    counts = [p for p in (1, 2, 4, 8, 16, 32, 64) if p <= max_splits]
    print(f"\ndecode at C={split_keys}, us per call by programs per (request, KV head) "
          f"(1: way a), capacity {capacity}")
    print(f"{'batch':>5}{'ctx':>6}" + "".join(f"{f'P={n}':>9}" for n in counts))
    for context in (512, 2048):
        for batch in (1, 8):
            s = Setup(heads, batch, context, capacity, layers_for(batch, context, hk, d))
            line = [graph_us(lambda i, s=s, n=n: fixed(s, i, split_keys, n), s.layers)
                    for n in counts]
            print(f"{batch:>5}{context:>6}" + "".join(f"{us:>9.1f}" for us in line))
            del s
            torch.cuda.empty_cache()


def prefill_table(heads: tuple[int, int, int], split_keys: list[int]) -> None:
    _, hk, d = heads
    print("\nprefill of one prompt, us per call: varlen, then the fixed split (a) per C")
    print(f"{'tokens':>6}{'varlen':>9}" + "".join(f"{f'C={c}':>10}" for c in split_keys))
    for tokens in PROMPTS:
        capacity = max(tokens, max(split_keys))
        s = Setup(heads, 1, tokens, capacity, layers_for(1, tokens, hk, d), query_len=tokens)
        varlen = graph_us(lambda i, s=s, n=tokens: paged_attention_varlen(
            s.q, s.kv_cache, s.tables[i], s.seq_lens, s.qsl, scale=s.scale,
            max_query_len=n, out=s.out), s.layers)
        cells = [graph_us(lambda i, s=s, c=c: fixed(s, i, c, 1), s.layers) for c in split_keys]
        print(f"{tokens:>6}{varlen:>9.1f}" + "".join(f"{v:>10.1f}" for v in cells))
        del s
        torch.cuda.empty_cache()


def checks(heads: tuple[int, int, int], split_keys: int, device: str = "cuda") -> bool:
    """A 3.5-split prompt's rows: whole prefill == decodes (a) == decodes (b) == verification
    windows (a and b), bit for bit."""
    length = 3 * split_keys + split_keys // 2
    capacity = 4 * split_keys
    s = Setup(heads, 1, length, capacity, 1, query_len=length, device=device)
    whole = fixed(s, 0, split_keys, 1).clone()
    ok = True
    positions = [0, split_keys - 1, split_keys, 2 * split_keys + 1, length - 1]
    for q_len in (1, 4):
        starts = [max(p - q_len + 1, 0) for p in positions]
        dev = s.q.device
        q = torch.cat([s.q[a:a + q_len] for a in starts])
        tables = s.tables[0].expand(len(starts), -1).contiguous()
        seq_lens = torch.tensor([a + q_len for a in starts], dtype=torch.int32, device=dev)
        qsl = torch.arange(len(starts) + 1, dtype=torch.int32, device=dev) * q_len
        expected = torch.cat([whole[a:a + q_len] for a in starts])
        for programs in (1, 2, 4):
            got = paged_attention_fixed_split(
                q, s.kv_cache, tables, seq_lens, qsl, scale=s.scale, max_query_len=q_len,
                split_keys=split_keys, split_programs=programs)
            same = torch.equal(got, expected)
            ok &= same
            print(f"check q_len {q_len}, {programs} programs: "
                  f"{'same bits' if same else 'DIFFERENT'} as the whole prefill")
    return ok


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b", choices=sorted(MODELS))
    p.add_argument("--capacity", type=int, default=8192)
    p.add_argument("--split-keys", default="128,256,512,1024")
    args = p.parse_args()
    heads = MODELS[args.model]
    split_keys = [int(c) for c in args.split_keys.split(",")]
    plan = fixed_split_plan(args.capacity, key_tile(heads[2], torch.bfloat16, True))
    print(f"{torch.cuda.get_device_name(0)}, model {args.model} {heads}, bf16, "
          f"capacity {args.capacity}: the plan's C = {plan.split_keys}")
    ok = checks(heads, 256)
    decode_table(heads, args.capacity, split_keys)
    programs_table(heads, args.capacity, plan.split_keys)
    prefill_table(heads, split_keys)
    print("checks:", "all the same bits" if ok else "FAILED")


if __name__ == "__main__":
    main()
