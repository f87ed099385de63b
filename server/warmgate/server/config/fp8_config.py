"""FP8 weights: the frozen value ModelConfig.fp8 holds (how the decoder projections and their
scales are stored) and the shape and device checks on it. config.hf_fp8 reads it from a
config.json's quantization_config and writes it back.

Which modules are FP8 is fixed: every decoder projection (q/k/v, o, the MLP's or each
expert's gate/up/down). The embedding, the norms, the MoE router and the vocabulary head stay
in the served dtype, as the checkpoints ship them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warmgate.server.config.config_error import ConfigError, _require
from warmgate.server.config.hf_moe import moe_weight_names

# Every FP8 scheme the runner implements (FP8Config.scheme).
FP8_SCHEMES = ("tensor", "channel", "block")
# The block format's one block shape (rows of N, columns of K), the kernels' K group too.
FP8_BLOCK = 128
# The largest finite float8_e4m3fn value: scales map each block's (row's) amax onto it.
FP8_E4M3_MAX = 448.0


@dataclass(frozen=True)
class FP8Config:
    """How a model's decoder projections are stored: float8_e4m3fn weights and their scales.

    scheme: "tensor" (one scale per checkpoint tensor, applied per output row once q/k/v and
    gate/up are fused), "channel" (one per output row) or "block" (one per 128x128 block).
    static_input: the checkpoint's `input_scale` tensors are the activations' scales (per
    tensor) instead of a scale per token computed on the fly. fmt: the checkpoint format it
    was read from (and is written back in): compressed-tensors, modelopt or fp8.
    ignore: the checkpoint's list of modules left unquantized, kept to write it back.
    """

    scheme: str = "tensor"
    static_input: bool = False
    fmt: str = "compressed-tensors"
    ignore: tuple[str, ...] = ("lm_head",)

    def __post_init__(self) -> None:
        if self.scheme not in FP8_SCHEMES:
            raise ValueError(f"FP8Config.scheme {self.scheme!r} is not one of {FP8_SCHEMES}")
        if self.scheme == "block" and (self.static_input or self.fmt != "fp8"):
            raise ValueError("FP8Config: block scales come from the fp8 format, dynamic only")

    @property
    def scale_suffix(self) -> str:
        """The scale tensor beside each `*.weight` (the block format stores the inverse)."""
        return "weight_scale_inv" if self.scheme == "block" else "weight_scale"

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        """The scale tensor's shape in a checkpoint, for a [rows, cols] weight."""
        if self.scheme == "block":
            return (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
        if self.scheme == "channel":
            return (rows, 1)
        return () if self.fmt == "modelopt" else (1,)

    def accepts_scale_shape(self, shape: tuple[int, ...], rows: int, cols: int) -> bool:
        """Per-tensor scales come as [] (ModelOpt) or [1] (compressed-tensors): both fit."""
        if self.scheme == "tensor":
            return shape in ((), (1,))
        return shape == self.scale_shape(rows, cols)


def check_fp8(model: Any) -> None:
    """A ModelConfig's FP8 shapes (ConfigError naming model.fp8). Block scales cover 128
    rows each: a fused projection (q/k/v, gate/up) whose parts did not start on a block edge
    would share a block between two checkpoint tensors. FP8 experts are implemented with
    block scales only."""
    fp8: FP8Config | None = model.fp8
    if fp8 is None:
        return
    _require(not model.is_moe or fp8.scheme == "block", "model.fp8",
             f"{fp8.scheme} FP8 scales on Mixture-of-Experts weights are not implemented "
             "(only 128x128 blocks, quant_method fp8)")
    if fp8.scheme != "block":
        return
    mlp = ("moe_intermediate_size", model.moe_intermediate_size) if model.is_moe else (
        "intermediate_size", model.intermediate_size)
    for name, rows in (("num_attention_heads * head_dim", model.num_heads * model.head_dim),
                       ("num_key_value_heads * head_dim", model.num_kv_heads * model.head_dim),
                       mlp):
        _require(rows % FP8_BLOCK == 0, "model.fp8", f"{name} = {rows} is not a multiple of "
                 f"the {FP8_BLOCK}-row scale blocks its fused projection needs")


def check_fp8_device(model: str, device: str, capability: tuple[int, int] | None) -> None:
    """FP8 matmuls need compute capability 8.9 (Ada, Hopper and later); an older GPU would
    fail at the first forward, so the load refuses it (ConfigError naming --model)."""
    if capability is None:
        import torch

        capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < (8, 9):
        raise ConfigError("model", f"{model} has FP8 weights, which need a GPU of compute "
                          f"capability 8.9 or newer; {device} is "
                          f"{capability[0]}.{capability[1]}")


def quantized_modules(model: Any) -> list[str]:
    """The module names (checkpoint naming) a ModelConfig runs in FP8."""
    out: list[str] = []
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        out += [f"{p}self_attn.{n}_proj" for n in ("q", "k", "v", "o")]
        if model.is_moe:
            _, experts = moe_weight_names(model.architecture, i, model.num_experts)
            out += [name.removesuffix(".weight") for names in experts for name in names]
        else:
            out += [f"{p}mlp.{n}_proj" for n in ("gate", "up", "down")]
    return out
