"""Where --deterministic attention cuts the keys, and how many programs run the cuts.

Two decisions, kept apart because only the first shapes a token's arithmetic:
- `fixed_split_plan(capacity, key_tile)`: the split size C. Split j holds the absolute key
  positions [j * C, (j + 1) * C) of every request, whatever its length, its query length or
  its batch; a pure function of the configuration (the block table's capacity
  max_blocks_per_req * block_size and the kernel's key tile), so a token's keys are cut at the
  same places in a prefill chunk, a decode and a verification.
  C = max(MIN_SPLIT_TILES, cdiv(capacity / MAX_SPLITS, tile)) tiles: at least
  MIN_SPLIT_TILES tiles (a split restarts its key tile pipeline and pays one fold, which a
  prefill program pays once per split), and at most MAX_SPLITS splits over the capacity (the
  workspace of the split-apart decode holds one float32 partial per split and query row).
  With the GPU's 64-key tiles that is 256 keys up to a capacity of 16384, then capacity / 64.
- `FixedSplitPlan.programs(...)`: how many programs share a (query block, request, KV head)'s
  splits. 1: one program walks its splits in order and folds each as it ends (way a: prefill
  and big batches, whose grid already fills the GPU). More: each split's state goes to a
  workspace and a second kernel folds them in the same order (way b: decodes, verifications
  and small mixed batches, whose grid would leave most SMs idle, while their workspace stays
  under MAX_WORKSPACE_BYTES, and at least MIN_APART_PROGRAMS would share them). The same
  float32 operations in the same order either way, so this choice never changes a bit; it
  reads only the launch's host ints (fixed per captured graph).
"""

from __future__ import annotations

from dataclasses import dataclass

# A split holds at least this many key tiles: the fold and the pipeline restart per split
# stay a small share of a prefill program's work.
MIN_SPLIT_TILES = 4
# Splits over the capacity, at most: bounds the decode workspace (MAX_SPLITS float32 partials
# of head_dim per query row) and the number of folds a long context pays.
MAX_SPLITS = 64
# A split-apart decode aims at two resident programs per SM: a decode program is a chain of
# dependent loads (seq_len, page, K, V) and one alone per SM leaves the memory system idle.
PROGRAMS_PER_SM = 2
# The split-apart workspace, at most (max_splits float32 partials of every query row): past
# it the batch has enough query rows to fill the GPU walking its splits in one program.
MAX_WORKSPACE_BYTES = 64 << 20
# Splitting apart in fewer programs than this does not pay for the workspace and the second
# kernel: at two programs (32 requests on 8 KV heads) an H100 walked faster on llama-3.2-1b
# (31.2 against 36.8 us at 512 keys, 99.6 against 117.3 at 2048) and llama-3.1-8b (49.2
# against 157.1, 169.0 against 527.7): h100-fixed-split-attention-*.txt.
MIN_APART_PROGRAMS = 3


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class FixedSplitPlan:
    split_keys: int  # C, a multiple of the kernel's key tile
    max_splits: int  # cdiv(capacity, C): the workspace's split count

    def programs(self, unsplit_programs: int, num_sms: int, split_bytes: int) -> int:
        """Programs per (query block, request, KV head) for a launch whose unsplit grid has
        `unsplit_programs` programs and whose partials take `split_bytes` a split: enough to
        bring the grid to PROGRAMS_PER_SM per SM, at most one per split; 1 when the unsplit
        grid already fills the GPU, the workspace would pass MAX_WORKSPACE_BYTES or fewer
        than MIN_APART_PROGRAMS would share the splits."""
        if self.max_splits * split_bytes > MAX_WORKSPACE_BYTES:
            return 1
        wanted = cdiv(PROGRAMS_PER_SM * num_sms, max(unsplit_programs, 1))
        programs = min(wanted, self.max_splits)
        return programs if programs >= MIN_APART_PROGRAMS else 1


def fixed_split_plan(capacity: int, key_tile: int) -> FixedSplitPlan:
    """The split size for a block table of `capacity` keys and a kernel of `key_tile` keys."""
    if capacity < 1 or key_tile < 1:
        raise ValueError(f"fixed_split_plan: capacity {capacity} and key tile {key_tile} "
                         "must be positive")
    tiles = max(MIN_SPLIT_TILES, cdiv(cdiv(capacity, MAX_SPLITS), key_tile))
    split_keys = tiles * key_tile
    return FixedSplitPlan(split_keys=split_keys, max_splits=cdiv(capacity, split_keys))
