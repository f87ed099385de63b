"""A MoE layer's tensors under the checkpoints' names, and their seeded random init.

The checkpoints (and transformers' save_pretrained) hold one tensor per expert and projection
(Qwen3-MoE: `mlp.experts.{e}.gate_proj/up_proj/down_proj`, Mixtral:
`block_sparse_moe.experts.{e}.w1/w3/w2`); the model holds them fused per layer
(runner.moe.MoEBlock). Each name maps to a view into the fused tensor, so loading a file's
tensor into its view is the fusion, and saving the views splits them back apart.
"""

from __future__ import annotations

import torch

from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.config.hf_moe import moe_weight_names
from warmgate.server.runner.fp8_linear import fill_fp8
from warmgate.server.runner.moe import MoEBlock


def moe_hf_views(moe: MoEBlock, architecture: str, layer: int) -> dict[str, torch.Tensor]:
    """{checkpoint name: view into moe's fused tensors} for layer `layer`."""
    inter = moe.w2.shape[2]
    router, experts = moe_weight_names(architecture, layer, moe.w13.shape[0])
    out: dict[str, torch.Tensor] = {router: moe.router}
    for e, (gate, up, down) in enumerate(experts):
        out.update({gate: moe.w13[e, :inter], up: moe.w13[e, inter:], down: moe.w2[e]})
    return out


@torch.no_grad()
def init_moe(moe: MoEBlock, gen: torch.Generator, residual_scale: float,
             fp8: FP8Config | None = None) -> None:
    """The router and the experts at fan_in^-0.5 (down further by residual_scale, as a dense
    layer's), so the routing is not degenerate and the stream does not grow with depth. FP8
    experts get the same draws, quantized."""
    h, inter = moe.w13.shape[2], moe.w2.shape[2]
    moe.router.normal_(0.0, h ** -0.5, generator=gen)
    for weight, scale, std in ((moe.w13, moe.w13_scale, h ** -0.5),
                               (moe.w2, moe.w2_scale, inter ** -0.5 * residual_scale)):
        if fp8 is None or scale is None:
            weight.normal_(0.0, std, generator=gen)
        else:
            fill_fp8(weight, scale, fp8, lambda t, std=std: t.normal_(0.0, std, generator=gen))
