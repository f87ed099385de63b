"""FP8 checkpoints of every supported format, written here from a float model, load with their
weights in FP8 and compute what the float model with the dequantized weights computes.

Each case quantizes a random float32 model the way its format's tools do (per tensor: one
scale per checkpoint tensor, so q, k and v get their own; per channel: one per row; blocks:
one per 128x128 block), writes the directory (runner.weights.save_weights, which writes the
format's quantization_config), and serves it on the CPU. The reference is a float checkpoint
of the same model whose projections hold the dequantized FP8 values.

Tolerance 1e-5 on float32 logits: on the CPU the FP8 path dequantizes each weight to float32
and runs the same F.linear as the float model (runner.fp8_linear), so the two compute the
same numbers; the bound only leaves room for a different summation order in the BLAS. The
quantization error itself (vs the original float weights) is far larger, and is checked to be
there: the test would not notice an FP8 model that silently kept float weights otherwise.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.reference_helpers import runner_for
from tests.runner_helpers import full_prefill_logits, prompt
from tests.test_model_load_errors import _server_exit
from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.config.hf_config import ModelLoadError, model_config_from_hf
from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.config.runner_config import (
    ConfigError,
    ModelConfig,
    ParallelConfig,
    RunnerConfig,
    resolve_runner_config,
)
from warmgate.server.runner.fp8_linear import dequantize, quantize
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.weights import init_random_weights, save_weights

# Block scales need every fused part (q, k, v; gate, up) to be whole 128-row blocks.
LLAMA = ModelConfig(vocab_size=256, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=64, intermediate_size=256, max_model_len=64,
                    rope=RopeConfig(theta=1e4))
MOE = ModelConfig(architecture="qwen3_moe", vocab_size=256, hidden_size=128, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=128, intermediate_size=128,
                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                  norm_topk_prob=True, max_model_len=64, rope=RopeConfig(theta=1e6))
CASES: dict[str, tuple[ModelConfig, FP8Config]] = {
    "compressed-tensors per tensor": (LLAMA, FP8Config("tensor")),
    "compressed-tensors per channel": (LLAMA, FP8Config("channel")),
    "compressed-tensors static input": (LLAMA, FP8Config("tensor", static_input=True)),
    "modelopt": (LLAMA, FP8Config("tensor", static_input=True, fmt="modelopt")),
    "block llama": (LLAMA, FP8Config("block", fmt="fp8", ignore=())),
    "block qwen3_moe": (MOE, FP8Config("block", fmt="fp8", ignore=())),
}
CPU = torch.device("cpu")


def _parts(model: LlamaModel, name: str) -> list[int]:
    """The checkpoint tensors' row counts inside a fused projection."""
    layer = model.layers[0]
    inter = model.config.intermediate_size
    return {"qkv_proj": [layer.q_size, layer.kv_size, layer.kv_size],
            "gate_up_proj": [inter, inter]}.get(name.rsplit(".", 1)[-1], [-1])


@torch.no_grad()
def quantized_copy(source: LlamaModel, fp8: FP8Config) -> LlamaModel:
    """`source` (float) with its projections quantized as a format's tools do: a per-tensor
    scale per checkpoint tensor (each part of a fused projection quantized alone)."""
    model = LlamaModel(dataclasses.replace(source.config, fp8=fp8), TorchOps(), None, CPU,
                       torch.float32)
    params = dict(model.named_parameters())
    for name, value in source.named_parameters():
        target, scale = params[name], params.get(name + "_scale")
        if scale is None:
            target.copy_(value)
            continue
        rows = _parts(model, name)
        pieces = value.split(rows) if fp8.scheme == "tensor" and rows != [-1] else [value]
        qs = [quantize(p, fp8) for p in pieces]
        target.copy_(torch.cat([q for q, _ in qs], dim=-2))
        scale.copy_(torch.cat([s for _, s in qs], dim=-1 if fp8.scheme != "block" else -2))
        if name + "_input_scale" in params:
            params[name + "_input_scale"].fill_(0.05)
    return model


@torch.no_grad()
def dequantized_copy(model: LlamaModel, source: LlamaModel) -> LlamaModel:
    """The float model holding `model`'s dequantized projections (the reference)."""
    out = LlamaModel(source.config, TorchOps(), None, CPU, torch.float32)
    params = dict(model.named_parameters())
    for name, target in out.named_parameters():
        scale = params.get(name + "_scale")
        target.copy_(params[name] if scale is None else dequantize(params[name], scale))
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Path]]:
    """{case: (FP8 directory, dequantized float directory, original float directory)}."""
    out = {}
    for case, (config, fp8) in CASES.items():
        root = tmp_path_factory.mktemp(case.replace(" ", "_"))
        source = LlamaModel(config, TorchOps(), None, CPU, torch.float32)
        init_random_weights(source, seed=3)
        model = quantized_copy(source, fp8)
        save_weights(model, model.config, root / "fp8")
        save_weights(dequantized_copy(model, source), config, root / "dequantized")
        save_weights(source, config, root / "float")
        out[case] = (root / "fp8", root / "dequantized", root / "float")
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_checkpoint_loads_and_equals_the_dequantized_model(
        case: str, written: dict[str, tuple[Path, Path, Path]]) -> None:
    fp8_dir, deq_dir, float_dir = written[case]
    config, fp8 = CASES[case]
    assert model_config_from_hf(fp8_dir).fp8 == fp8  # the written format reads back as itself
    runner = runner_for(fp8_dir, max_model_len=64)
    layer = runner.model.layers[0]
    # The weights stay FP8 in memory; the head, embedding, norms and router do not.
    fp8_params = [layer.qkv_proj, layer.o_proj] + (
        [layer.moe.w13, layer.moe.w2] if layer.moe is not None
        else [layer.gate_up_proj, layer.down_proj])
    assert all(p is not None and p.dtype == torch.float8_e4m3fn for p in fp8_params)
    assert runner.model.lm_head is not None and runner.model.lm_head.dtype == torch.float32
    assert layer.moe is None or layer.moe.router.dtype == torch.float32
    tokens = prompt(40, vocab=config.vocab_size)
    got = full_prefill_logits(runner, tokens)
    want = full_prefill_logits(runner_for(deq_dir, max_model_len=64), tokens)
    assert (got - want).abs().max().item() <= 1e-5
    original = full_prefill_logits(runner_for(float_dir, max_model_len=64), tokens)
    assert (got - original).abs().max().item() > 1e-4  # quantized: not the float weights


def test_per_tensor_scales_stay_per_checkpoint_tensor(
        written: dict[str, tuple[Path, Path, Path]]) -> None:
    """q, k and v keep their own per-tensor scale inside the fused projection, and ModelOpt's
    static input scales ([] in its files) reach the fused one."""
    fp8_dir = written["modelopt"][0]
    tensors = load_file(str(fp8_dir / "model.safetensors"))
    p = "model.layers.0.self_attn."
    scales = [tensors[f"{p}{n}_proj.weight_scale"] for n in "qkv"]
    assert all(s.shape == () for s in scales) and len({float(s) for s in scales}) == 3
    layer = runner_for(fp8_dir, max_model_len=64).model.layers[0]
    rows = [0, layer.q_size, layer.q_size + layer.kv_size]
    assert layer.qkv_proj_scale is not None and layer.qkv_proj_input_scale is not None
    assert [float(layer.qkv_proj_scale[r]) for r in rows] == [float(s) for s in scales]
    assert float(layer.qkv_proj_input_scale) == pytest.approx(0.05)


def test_fused_parts_take_the_largest_static_input_scale(
        written: dict[str, tuple[Path, Path, Path]], tmp_path: Path) -> None:
    """q, k and v share one activation quantization: the largest of their input scales, so
    none of them clips."""
    p = "model.layers.0.self_attn."
    directory = _rewrite(written["modelopt"][0], tmp_path / "inputs", lambda t: t.update(
        {f"{p}{n}_proj.input_scale": torch.tensor(v) for n, v in zip("qkv", (0.02, 0.07, 0.05),
                                                                      strict=True)}), None)
    layer = runner_for(directory, max_model_len=64).model.layers[0]
    assert layer.qkv_proj_input_scale is not None
    assert float(layer.qkv_proj_input_scale) == pytest.approx(0.07)


@pytest.mark.parametrize(("case", "shape"), [("modelopt", (1,)),
                                             ("compressed-tensors per tensor", ())])
def test_per_tensor_scales_load_as_either_shape_real_files_use(
        case: str, shape: tuple[int, ...], written: dict[str, tuple[Path, Path, Path]],
        tmp_path: Path) -> None:
    """ModelOpt writes per-tensor scales as [], compressed-tensors as [1]: either loads."""
    def reshape(t: dict[str, torch.Tensor]) -> None:
        for name in [n for n in t if n.endswith(("weight_scale", "input_scale"))]:
            t[name] = t[name].reshape(shape).contiguous()

    directory = _rewrite(written[case][0], tmp_path / "reshaped", reshape, None)
    tokens = prompt(20, vocab=LLAMA.vocab_size)
    torch.testing.assert_close(full_prefill_logits(runner_for(directory, max_model_len=64),
                                                   tokens),
                               full_prefill_logits(runner_for(written[case][0],
                                                              max_model_len=64), tokens))


def _rewrite(src: Path, dst: Path, tensors: Callable[[dict[str, torch.Tensor]], None] | None,
             config: Callable[[dict[str, Any]], None] | None) -> Path:
    dst.mkdir()
    hf = json.loads((src / "config.json").read_text())
    if config is not None:
        config(hf)
    (dst / "config.json").write_text(json.dumps(hf))
    data = load_file(str(src / "model.safetensors"))
    if tensors is not None:
        tensors(data)
    save_file(data, str(dst / "model.safetensors"))
    return dst


SCALE_EDITS: dict[str, tuple[str, str, str]] = {
    # case: (written case, tensor, what it becomes)
    "per-channel scale as per-tensor": ("compressed-tensors per channel",
                                        "model.layers.1.self_attn.k_proj.weight_scale", "[1]"),
    "block scale one block short": ("block llama",
                                    "model.layers.0.mlp.up_proj.weight_scale_inv", "short"),
    "expert block scale empty": ("block qwen3_moe",
                                 "model.layers.1.mlp.experts.2.down_proj.weight_scale_inv",
                                 "short"),
    "block scale transposed": ("block qwen3_moe",
                               "model.layers.1.self_attn.q_proj.weight_scale_inv",
                               "transposed"),
    "per-tensor scale per row": ("compressed-tensors per tensor",
                                 "model.layers.0.mlp.down_proj.weight_scale", "rows"),
}


@pytest.mark.parametrize("case", list(SCALE_EDITS))
def test_wrong_scale_shape_fails_the_load_naming_the_tensor(
        case: str, written: dict[str, tuple[Path, Path, Path]], tmp_path: Path) -> None:
    source, name, how = SCALE_EDITS[case]

    def edit(t: dict[str, torch.Tensor]) -> None:
        s = t[name]
        edits: dict[str, Callable[[], torch.Tensor]] = {
            "[1]": lambda: s[:1, 0], "transposed": lambda: s.T,
            "short": lambda: s[:-1] if s.shape[0] > 1 else s[:, :0],
            "rows": lambda: s.reshape(1).expand(8, 1)}
        t[name] = edits[how]().contiguous()
        assert t[name].shape != s.shape

    directory = _rewrite(written[source][0], tmp_path / "edited", edit, None)
    with pytest.raises(ModelLoadError) as err:
        runner_for(directory, max_model_len=64)
    message = str(err.value)
    assert "\n" not in message and f": {name}: shape " in message, message


def test_fp8_weight_stored_in_another_dtype_fails_naming_it(
        written: dict[str, tuple[Path, Path, Path]], tmp_path: Path) -> None:
    """A projection the config makes FP8 but the file holds in bf16 (or an FP8 tensor where
    no scale is read, like the head) would be read with the wrong meaning: refused."""
    name = "model.layers.0.self_attn.o_proj.weight"
    directory = _rewrite(written["block llama"][0], tmp_path / "bf16", lambda t: t.update(
        {name: t[name].to(torch.bfloat16)}), None)
    with pytest.raises(ModelLoadError, match=rf"{name}: dtype BF16: quantization_config"):
        runner_for(directory, max_model_len=64)
    directory = _rewrite(written["block llama"][0], tmp_path / "head", lambda t: t.update(
        {"lm_head.weight": t["lm_head.weight"].to(torch.float8_e4m3fn)}), None)
    with pytest.raises(ModelLoadError, match=r"lm_head\.weight: dtype F8_E4M3, but only"):
        runner_for(directory, max_model_len=64)


def _group(q: dict[str, Any]) -> dict[str, Any]:
    return dict(q["config_groups"]["group_0"])


UNSUPPORTED: dict[str, tuple[str, Callable[[dict[str, Any]], None], str]] = {
    # case: (written case, edit of quantization_config, the key the error names)
    "fp8 kv cache": ("compressed-tensors per tensor",
                     lambda q: q.update(kv_cache_scheme={"num_bits": 8, "type": "float"}),
                     "kv_cache_scheme"),
    "int8 weights": ("compressed-tensors per tensor",
                     lambda q: q["config_groups"]["group_0"]["weights"].update(type="int"),
                     "config_groups.group_0.weights.num_bits"),
    "4-bit weights": ("compressed-tensors per channel",
                      lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=4),
                      "config_groups.group_0.weights.num_bits"),
    "group strategy": ("compressed-tensors per channel",
                       lambda q: q["config_groups"]["group_0"]["weights"].update(
                           strategy="group", group_size=128),
                       "config_groups.group_0.weights.strategy"),
    "weight-only": ("compressed-tensors per tensor",
                    lambda q: q["config_groups"]["group_0"].update(input_activations=None),
                    "config_groups.group_0.input_activations"),
    "per-token static": ("compressed-tensors per tensor",
                         lambda q: q["config_groups"]["group_0"]["input_activations"].update(
                             dynamic=False), "config_groups.group_0.input_activations.strategy"),
    "two groups": ("compressed-tensors per tensor",
                   lambda q: q["config_groups"].update(group_1=_group(q)), "config_groups"),
    "ignored projection": ("compressed-tensors per tensor",
                           lambda q: q.update(ignore=["lm_head", "re:.*layers\\.1\\.mlp\\..*"]),
                           "ignore"),
    "quantized head": ("compressed-tensors per tensor", lambda q: q.update(ignore=[]),
                       "ignore"),
    "modelopt quantized head": ("modelopt", lambda q: q.update(exclude_modules=["*gate*"]),
                                "exclude_modules"),
    "unknown key": ("compressed-tensors per tensor", lambda q: q.update(smoothing=0.5),
                    "smoothing"),
    "modelopt fp8 kv cache": ("modelopt", lambda q: q.update(kv_cache_quant_algo="FP8"),
                              "kv_cache_quant_algo"),
    "modelopt nvfp4": ("modelopt", lambda q: q.update(quant_algo="NVFP4"), "quant_algo"),
    "modelopt excluded projection": ("modelopt", lambda q: q.update(
        exclude_modules=["lm_head", "*self_attn.o_proj"]), "exclude_modules"),
    "static block activations": ("block llama", lambda q: q.update(activation_scheme="static"),
                                 "activation_scheme"),
    "64x64 blocks": ("block llama", lambda q: q.update(weight_block_size=[64, 64]),
                     "weight_block_size"),
    "e5m2": ("block qwen3_moe", lambda q: q.update(fmt="e5m2"), "fmt"),
    "unconverted experts": ("block qwen3_moe", lambda q: q.update(
        modules_to_not_convert=["model.layers.0.mlp.experts"]), "modules_to_not_convert"),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_unsupported_quantization_key_fails_the_load_naming_it(
        case: str, written: dict[str, tuple[Path, Path, Path]], tmp_path: Path) -> None:
    source, edit, key = UNSUPPORTED[case]
    directory = _rewrite(written[source][0], tmp_path / "edited", None,
                         lambda hf: edit(hf["quantization_config"]))
    with pytest.raises(ModelLoadError) as err:
        model_config_from_hf(directory)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{directory / 'config.json'}: quantization_config.{key}: "), (
        message)


def test_router_and_head_in_the_ignore_list_are_accepted(
        written: dict[str, tuple[Path, Path, Path]], tmp_path: Path) -> None:
    """An ignore list naming only what stays in the served dtype (the head, Qwen3-MoE's
    router, as llm-compressor writes them) loads."""
    directory = _rewrite(written["block qwen3_moe"][0], tmp_path / "ignored", None,
                         lambda hf: hf["quantization_config"].update(
                             modules_to_not_convert=["lm_head", "re:.*mlp.gate$"]))
    fp8 = model_config_from_hf(directory).fp8
    assert fp8 is not None and fp8.ignore == ("lm_head", "re:.*mlp.gate$")


def test_shapes_fp8_cannot_serve_fail_naming_quantization_config(
        written: dict[str, tuple[Path, Path, Path]], tmp_path: Path) -> None:
    """Per-tensor scales on experts (only blocks are implemented for them), and block scales
    over a fused projection whose parts do not start on a 128-row block edge."""
    ct = json.loads((written["compressed-tensors per tensor"][0] / "config.json").read_text())
    directory = _rewrite(written["block qwen3_moe"][0], tmp_path / "experts", None,
                         lambda hf: hf.update(quantization_config=ct["quantization_config"]))
    with pytest.raises(ModelLoadError, match=r"config\.json: quantization_config: tensor FP8 "
                       r"scales on Mixture-of-Experts weights are not implemented"):
        model_config_from_hf(directory)
    with pytest.raises(ConfigError, match=r"model\.fp8: num_key_value_heads \* head_dim = 64 "
                       "is not a multiple of the 128-row"):
        dataclasses.replace(LLAMA, num_heads=8, num_kv_heads=1, fp8=FP8Config("block",
                                                                               fmt="fp8"))


def test_an_fp8_model_refuses_a_gpu_without_fp8_and_tensor_parallel() -> None:
    """Compute capability below 8.9 (an A100 is 8.0) has no FP8 matmul: refused when the
    configuration is resolved, before anything loads, naming --model's field; an H100/H200
    (9.0) and an L40S (8.9) pass."""
    config = RunnerConfig(model=dataclasses.replace(LLAMA, fp8=FP8Config()))
    with pytest.raises(ConfigError) as err:
        resolve_runner_config(config, cuda_available=True, flashinfer_available=False,
                              triton_available=True, cuda_capability=(8, 0))
    assert err.value.field_name == "model" and "\n" not in str(err.value)
    assert "FP8 weights, which need a GPU of compute capability 8.9 or newer; cuda is 8.0" in (
        str(err.value))
    for capability in ((8, 9), (9, 0)):
        resolve_runner_config(config, cuda_available=True, flashinfer_available=False,
                              triton_available=True, cuda_capability=capability)
    resolve_runner_config(config, cuda_available=False)  # the CPU dequantizes
    with pytest.raises(ConfigError, match=r"parallel\.tensor_parallel_size: FP8 weights run on "
                       "one GPU only"):
        dataclasses.replace(config, parallel=ParallelConfig(tensor_parallel_size=2))


@pytest.mark.slow
@pytest.mark.parametrize(("what", "key"), [
    ("config", "quantization_config.kv_cache_scheme"),
    ("tensor", "model.layers.0.self_attn.v_proj.weight_scale")])
def test_server_exits_2_with_one_line_on_a_bad_fp8_checkpoint(
        what: str, key: str, written: dict[str, tuple[Path, Path, Path]],
        tmp_path: Path) -> None:
    source = written["compressed-tensors per tensor"][0]
    if what == "config":
        directory = _rewrite(source, tmp_path / "m", None, lambda hf: hf[
            "quantization_config"].update(kv_cache_scheme={"num_bits": 8, "type": "float"}))
    else:
        directory = _rewrite(source, tmp_path / "m", lambda t: t.update(
            {key: torch.ones(2, 1)}), None)
    proc = _server_exit(directory)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if key in line]
    assert len(errors) == 1, proc.stderr


@pytest.mark.parametrize(("case", "scale", "param"), [
    ("block llama", "model.layers.1.self_attn.o_proj.weight_scale_inv", "o_proj_scale"),
    ("compressed-tensors per channel", "model.layers.1.self_attn.o_proj.weight_scale",
     "o_proj_scale")])
def test_bf16_scales_load_as_float32(case: str, scale: str, param: str,
                                     written: dict[str, tuple[Path, Path, Path]],
                                     tmp_path: Path) -> None:
    """Qwen3.5/3.6-FP8 and llm-compressor store scales in bf16 too: read and widened."""
    def to_bf16(t: dict[str, torch.Tensor]) -> None:
        for name in [n for n in t if n.endswith(("_scale", "_scale_inv"))]:
            t[name] = t[name].to(torch.bfloat16)

    directory = _rewrite(written[case][0], tmp_path / "bf16", to_bf16, None)
    want = load_file(str(directory / "model.safetensors"))[scale].float()
    got = getattr(runner_for(directory, max_model_len=64).model.layers[1], param)
    assert got.dtype == torch.float32
    assert torch.equal(got.reshape(want.shape), want)
