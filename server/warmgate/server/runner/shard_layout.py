"""Which part of each tensor a rank holds, and whether a model can be split N ways at all.

Pure arithmetic (no torch): the start-up check in config.server_config uses it before any
process starts. Megatron's layout: attention heads and MLP rows are split into N contiguous
blocks; KV heads too, or, when there are fewer KV heads than ranks, each rank keeps the one
KV head its query heads read (replicated). The vocabulary is split into N blocks of
ceil(V / N) rows, the last one padded.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmgate.server.config.runner_config import ConfigError, ModelConfig, cdiv

TP_FIELD = "parallel.tensor_parallel_size"


def check_divisible(model: ModelConfig, size: int) -> None:
    """ConfigError naming the model, the field and N when the model cannot be split."""
    if size == 1:
        return

    def refuse(what: str) -> None:
        raise ConfigError(TP_FIELD, f"model {model.name}: {what}, so it cannot be split "
                                    f"across {size} ranks")

    if model.num_heads % size:
        refuse(f"num_heads ({model.num_heads}) is not divisible by {size}")
    if model.intermediate_size % size:
        refuse(f"intermediate_size ({model.intermediate_size}) is not divisible by {size}")
    if model.num_kv_heads >= size and model.num_kv_heads % size:
        refuse(f"num_kv_heads ({model.num_kv_heads}) is not divisible by {size}")
    if model.num_kv_heads < size and size % model.num_kv_heads:
        refuse(f"num_kv_heads ({model.num_kv_heads}) is fewer than {size} ranks and does not "
               f"divide {size} (each rank must read exactly one replicated KV head)")


@dataclass(frozen=True)
class ShardLayout:
    """Rank `rank` of `size`: its heads, KV heads, MLP rows and vocabulary rows."""

    rank: int
    size: int
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank (1 when replicated)
    kv_head_start: int  # the first KV head (of the full model) this rank holds
    head_dim: int
    intermediate_size: int  # MLP rows on this rank
    vocab_rows: int  # ceil(V / N): every rank's embedding has this many rows
    vocab_start: int
    vocab_size: int  # the full vocabulary, for the logits gathered back

    @classmethod
    def of(cls, model: ModelConfig, rank: int, size: int) -> ShardLayout:
        check_divisible(model, size)
        heads = model.num_heads // size
        if model.num_kv_heads >= size:
            kv_heads = model.num_kv_heads // size
            kv_start = rank * kv_heads
        else:  # replicated: ranks r*k .. r*k+k-1 share KV head r, k = size / num_kv_heads
            kv_heads = 1
            kv_start = rank // (size // model.num_kv_heads)
        vocab_rows = cdiv(model.vocab_size, size)
        return cls(rank=rank, size=size, num_heads=heads, num_kv_heads=kv_heads,
                   kv_head_start=kv_start, head_dim=model.head_dim,
                   intermediate_size=model.intermediate_size // size, vocab_rows=vocab_rows,
                   vocab_start=rank * vocab_rows, vocab_size=model.vocab_size)

    @property
    def q_rows(self) -> slice:
        """This rank's rows of q_proj (and its bias), columns of o_proj."""
        width = self.num_heads * self.head_dim
        return slice(self.rank * width, (self.rank + 1) * width)

    @property
    def kv_rows(self) -> slice:
        """This rank's rows of k_proj and v_proj (and their biases)."""
        start = self.kv_head_start * self.head_dim
        return slice(start, start + self.num_kv_heads * self.head_dim)

    @property
    def mlp_rows(self) -> slice:
        """This rank's rows of gate_proj and up_proj, columns of down_proj."""
        width = self.intermediate_size
        return slice(self.rank * width, (self.rank + 1) * width)

    @property
    def vocab_slice(self) -> slice:
        """This rank's rows of the embedding and lm_head that exist (the last may be short)."""
        return slice(min(self.vocab_start, self.vocab_size),
                     min(self.vocab_start + self.vocab_rows, self.vocab_size))
