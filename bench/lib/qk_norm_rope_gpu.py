"""Qwen3's per-head q/k RMSNorm on the GPU: the two rms_norm launches a layer ran before
rope_and_cache against the norms inside it (kernels/rope_cache.py with the norm weights), per
preset attention shape and token count, and the outputs compared.

    python bench/lib/qk_norm_rope_gpu.py [--models qwen3-0.6b,qwen3-30b-a3b]
                                         [--tokens 1,8,64,256]

Each time is a CUDA graph's (the way decode runs) of one call per layer, every layer with its
own qkv, norm weights and KV cache, so a step's working set crosses memory as the model's
would. `saved/step` is the difference times the preset's layer count. `differ` is the share of
q-output and cache elements where the two paths disagree (the fused norm sums the squares as
two halves of the head: expect almost none in bf16) and `max diff` the largest difference.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from graph_timing import graph_us

MODELS = ("qwen3-0.6b", "qwen3-30b-a3b")
TOKENS = (1, 8, 64, 256)
BLOCK_SIZE = 16
MAX_POS = 4096
DTYPE = torch.bfloat16


@dataclass
class LayerInputs:
    """One layer's attention input: views of its fused projection, norm gains and cache."""

    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hk, D]
    v: torch.Tensor  # [T, Hk, D]
    q_weight: torch.Tensor  # [D]
    k_weight: torch.Tensor  # [D]
    cache: torch.Tensor  # [2, num_blocks, BLOCK_SIZE, Hk, D]


def make_layer(tokens: int, heads: int, kv_heads: int, head_dim: int,
               gen: torch.Generator) -> LayerInputs:
    dev = torch.device("cuda")
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=dev, generator=gen,
                      dtype=DTYPE)
    q_end, k_end = heads * head_dim, (heads + kv_heads) * head_dim
    num_blocks = tokens // BLOCK_SIZE + 2
    return LayerInputs(
        q=qkv[:, :q_end].view(tokens, heads, head_dim),
        k=qkv[:, q_end:k_end].view(tokens, kv_heads, head_dim),
        v=qkv[:, k_end:].view(tokens, kv_heads, head_dim),
        q_weight=torch.rand(head_dim, device=dev, generator=gen).add(0.5).to(DTYPE),
        k_weight=torch.rand(head_dim, device=dev, generator=gen).add(0.5).to(DTYPE),
        cache=torch.zeros(2, num_blocks, BLOCK_SIZE, kv_heads, head_dim, device=dev,
                          dtype=DTYPE))


Step = Callable[[LayerInputs], torch.Tensor]


def paths(positions: torch.Tensor, cos_sin: torch.Tensor, slots: torch.Tensor,
          eps: float) -> tuple[Step, Step]:
    """(separate, fused): each writes the layer's cache and returns the rotated q."""
    from warmgate.server.kernels.rms_norm import rms_norm
    from warmgate.server.kernels.rope_cache import rope_and_cache

    def separate(x: LayerInputs) -> torch.Tensor:
        head_dim = x.q.shape[-1]
        q, _ = rms_norm(x.q.reshape(-1, head_dim), x.q_weight, eps)
        k, _ = rms_norm(x.k.reshape(-1, head_dim), x.k_weight, eps)
        return rope_and_cache(q.view(x.q.shape), k.view(x.k.shape), x.v, positions, cos_sin,
                              x.cache[0], x.cache[1], slots)

    def fused(x: LayerInputs) -> torch.Tensor:
        return rope_and_cache(x.q, x.k, x.v, positions, cos_sin, x.cache[0], x.cache[1],
                              slots, q_norm_weight=x.q_weight, k_norm_weight=x.k_weight,
                              eps=eps)

    return separate, fused


def compare(separate: Step, fused: Step, layer: LayerInputs) -> tuple[float, float]:
    """(share of differing elements, largest difference) over the q output and the cache."""
    sep_q = separate(layer).float()
    sep_cache = layer.cache.float()
    fused_q = fused(layer).float()
    fused_cache = layer.cache.float()
    differ = (int((sep_q != fused_q).sum()) + int((sep_cache != fused_cache).sum()))
    total = sep_q.numel() + sep_cache.numel()
    biggest = max(float((sep_q - fused_q).abs().max()),
                  float((sep_cache - fused_cache).abs().max()))
    return differ / total, biggest


def bench_model(model: str, tokens: list[int], gen: torch.Generator) -> None:
    from warmgate.server.config.runner_config import ModelConfig
    from warmgate.server.runner.ops import build_cos_sin_cache

    c = ModelConfig.from_preset(model)
    if not c.qk_norm:
        sys.exit(f"--models: {model} has no per-head q/k norm")
    cos_sin = build_cos_sin_cache(MAX_POS, c.head_dim, c.rope, torch.device("cuda"))
    print(f"\n== {model}: {c.num_layers} layers, {c.num_heads} q heads, {c.num_kv_heads} kv "
          f"heads, head_dim {c.head_dim}; us per layer")
    print(f"{'T':>4} {'separate':>9} {'fused':>8} {'f/s':>5} {'saved/step':>11} "
          f"{'differ':>8} {'max diff':>9}")
    for t in tokens:
        layers = [make_layer(t, c.num_heads, c.num_kv_heads, c.head_dim, gen)
                  for _ in range(c.num_layers)]
        positions = torch.randint(0, MAX_POS, (t,), device="cuda", generator=gen)
        slots = torch.arange(BLOCK_SIZE, BLOCK_SIZE + t, device="cuda")
        separate, fused = paths(positions, cos_sin, slots, c.rms_norm_eps)
        sep_us = graph_us(lambda i, f=separate, ls=layers: f(ls[i]), len(layers))
        fused_us = graph_us(lambda i, f=fused, ls=layers: f(ls[i]), len(layers))
        differ, biggest = compare(separate, fused, layers[0])
        print(f"{t:>4} {sep_us:>9.2f} {fused_us:>8.2f} {fused_us / sep_us:>5.2f} "
              f"{(sep_us - fused_us) * c.num_layers:>11.1f} {differ:>8.1e} {biggest:>9.1e}")
        layers.clear()
        torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated presets with q/k norms (default {','.join(MODELS)})")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)),
                   help="token counts of a step, each >= 1")
    args = p.parse_args()
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        p.error(f"--tokens: comma-separated integers, got {args.tokens!r}")
    if not all(t >= 1 for t in tokens):
        p.error(f"--tokens: each token count must be >= 1, got {args.tokens}")
    if not torch.cuda.is_available():
        sys.exit("qk_norm_rope_gpu needs a CUDA device")
    from warmgate.server.devtools.gpu_card import detect

    print(detect("cuda").describe())
    gen = torch.Generator(device="cuda").manual_seed(0)
    for model in args.models.split(","):
        bench_model(model, tokens, gen)


if __name__ == "__main__":
    main()
