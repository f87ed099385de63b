"""Tensor parallel without processes: which models split N ways (and the one-line refusal),
each rank's heads and vocabulary rows, and that a rank's shard, drawn at random or read from
safetensors as slices, is exactly its slice of the TP=1 weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.runner_helpers import tiny_config
from warmgate.server.config.runner_config import ConfigError, ModelConfig
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.shard_layout import ShardLayout, check_divisible
from warmgate.server.runner.tensor_parallel import TensorParallel
from warmgate.server.runner.weights import init_random_weights, load_weights, save_weights
from warmgate.server.startup import load_server_config

SMOLLM2_LIKE = dict(num_heads=9, num_kv_heads=3, head_dim=8, hidden_size=72,
                    intermediate_size=96, vocab_size=101)


def _model(config: ModelConfig, tp: TensorParallel | None = None) -> LlamaModel:
    return LlamaModel(config, TorchOps(), None, torch.device("cpu"), torch.float32, tp)


@pytest.mark.parametrize(("overrides", "size", "field"), [
    ({}, 3, "num_heads (4)"),
    (dict(num_heads=4, intermediate_size=129), 2, "intermediate_size (129)"),
    (dict(num_heads=8, num_kv_heads=4), 8, None),  # 4 KV heads, 8 ranks: 2 share each
    (dict(num_heads=12, num_kv_heads=6), 4, "num_kv_heads (6)"),  # 6 % 4
    (dict(num_heads=12, num_kv_heads=4, intermediate_size=96), 6, "num_kv_heads (4)"),
    (SMOLLM2_LIKE, 3, None),
])
def test_divisibility(overrides: dict[str, int], size: int, field: str | None) -> None:
    model = ModelConfig(**{**dict(intermediate_size=128), **overrides})
    if field is None:
        check_divisible(model, size)
        return
    with pytest.raises(ConfigError) as info:
        check_divisible(model, size)
    assert info.value.field_name == "parallel.tensor_parallel_size"
    assert f"model tiny: {field}" in info.value.message and str(size) in info.value.message


def test_non_dividing_size_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    with pytest.raises(SystemExit) as info:
        load_server_config(["--tensor-parallel-size", "3", "--device", "cpu"], environ={})
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "argument --tensor-parallel-size: model tiny: num_heads (4) is not divisible by 3" \
        in err


def test_flag_and_env_reach_the_runner_config() -> None:
    flag = load_server_config(["--tensor-parallel-size", "2", "--device", "cpu"], environ={})
    env = load_server_config(["--device", "cpu"], environ={"WARMGATE_TENSOR_PARALLEL_SIZE": "2"})
    default = load_server_config(["--device", "cpu"], environ={})
    assert flag.runner.parallel.tensor_parallel_size == 2
    assert env.runner.parallel.tensor_parallel_size == 2
    assert default.runner.parallel.tensor_parallel_size == 1
    assert flag.runner.config_hash() != default.runner.config_hash()


def test_compile_with_tensor_parallel_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_server_config(["--tensor-parallel-size", "2", "--device", "cpu", "--compile"],
                           environ={})
    assert "argument --tensor-parallel-size: 2 ranks with --compile" in capsys.readouterr().err


def test_replicated_kv_heads_follow_the_query_heads() -> None:
    # 8 query heads, 2 KV heads (4 query heads each), 4 ranks.
    model = ModelConfig(num_heads=8, num_kv_heads=2, intermediate_size=128)
    layouts = [ShardLayout.of(model, r, 4) for r in range(4)]
    assert [lay.num_heads for lay in layouts] == [2] * 4
    assert [lay.num_kv_heads for lay in layouts] == [1] * 4
    # Query head i reads KV head i // 4: rank r holds heads 2r, 2r+1 -> KV head r // 2.
    assert [lay.kv_head_start for lay in layouts] == [0, 0, 1, 1]


def test_vocabulary_blocks_cover_it_once_with_padding() -> None:
    model = ModelConfig(**SMOLLM2_LIKE)
    layouts = [ShardLayout.of(model, r, 3) for r in range(3)]
    assert {lay.vocab_rows for lay in layouts} == {34}
    covered = [i for lay in layouts for i in range(101)[lay.vocab_slice]]
    assert covered == list(range(101))


def _expected_shard(full: LlamaModel, layout: ShardLayout) -> dict[str, torch.Tensor]:
    """Each local parameter, cut from the TP=1 model by hand."""
    cfg = full.config
    d, inter = cfg.head_dim, cfg.intermediate_size
    qf, kvf = cfg.num_heads * d, cfg.num_kv_heads * d
    out: dict[str, torch.Tensor] = {}
    vocab = torch.zeros(layout.vocab_rows, cfg.hidden_size)
    rows = full.embed_tokens[layout.vocab_slice]
    vocab[:rows.shape[0]] = rows
    out["embed_tokens"] = vocab
    for i, layer in enumerate(full.layers):
        q, k, v = layer.qkv_proj.split([qf, kvf, kvf])
        out[f"layers.{i}.qkv_proj"] = torch.cat([q[layout.q_rows], k[layout.kv_rows],
                                                 v[layout.kv_rows]])
        out[f"layers.{i}.o_proj"] = layer.o_proj[:, layout.q_rows]
        gate, up = layer.gate_up_proj.split(inter)
        out[f"layers.{i}.gate_up_proj"] = torch.cat([gate[layout.mlp_rows],
                                                     up[layout.mlp_rows]])
        out[f"layers.{i}.down_proj"] = layer.down_proj[:, layout.mlp_rows]
        out[f"layers.{i}.input_layernorm"] = layer.input_layernorm
    return out


@pytest.mark.parametrize(("overrides", "size"), [({}, 2), (SMOLLM2_LIKE, 3),
                                                 (dict(num_kv_heads=1), 4)])
def test_random_shards_are_slices_of_the_tp1_weights(overrides: dict[str, int],
                                                     size: int) -> None:
    config = tiny_config(**overrides).model
    full = _model(config)
    init_random_weights(full, seed=7)
    for rank in range(size):
        layout = ShardLayout.of(config, rank, size)
        shard = _model(config, TensorParallel(layout))
        init_random_weights(shard, seed=7)
        params = dict(shard.named_parameters())
        for name, expected in _expected_shard(full, layout).items():
            assert torch.equal(params[name], expected), (rank, name)


def test_loaded_shards_are_slices_read_as_slices(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    config = dataclasses.replace(tiny_config(**SMOLLM2_LIKE).model, architecture="qwen2")
    full = _model(config)
    init_random_weights(full, seed=3)
    save_weights(full, config, tmp_path)
    streamed: list[int] = []  # bytes each load streamed from the file
    sliced: list[str] = []  # tensors read as a safetensors slice
    whole: list[str] = []  # tensors read whole (none may be)
    from safetensors import safe_open

    from warmgate.server.runner import weights

    stream_into = weights.stream_into

    def recording_stream(copies: list[Any], device: Any, **kwargs: Any) -> Any:
        streamed.append(sum(entry.end - entry.begin for _, entry, _ in copies))
        return stream_into(copies, device, **kwargs)

    class Recording:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._inner = safe_open(*args, **kwargs)

        def __enter__(self) -> Recording:
            self._handle = self._inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self._inner.__exit__(*exc)

        def get_tensor(self, name: str) -> torch.Tensor:
            whole.append(name)
            return self._handle.get_tensor(name)

        def get_slice(self, name: str) -> Any:
            sliced.append(name)
            return self._handle.get_slice(name)

    monkeypatch.setattr(weights, "stream_into", recording_stream)
    monkeypatch.setattr("warmgate.server.runner.tensor_parallel.safe_open", Recording)
    for rank in range(3):
        layout = ShardLayout.of(config, rank, 3)
        shard = _model(dataclasses.replace(config, weights_path=str(tmp_path)),
                       TensorParallel(layout))
        load_weights(tmp_path, shard)
        params = dict(shard.named_parameters())
        for name, expected in _expected_shard(full, layout).items():
            assert torch.equal(params[name], expected), (rank, name)
        q_bias = full.layers[0].qkv_bias[:config.num_heads * config.head_dim][layout.q_rows]
        assert torch.equal(params["layers.0.qkv_bias"][:q_bias.shape[0]], q_bias)
    # The column blocks (o_proj, down_proj) by slice, nothing whole; the rest streamed as row
    # ranges: each rank streams about a third of what a TP=1 load streams.
    assert whole == [] and sliced and all("o_proj" in n or "down_proj" in n for n in sliced)
    load_weights(tmp_path, _model(dataclasses.replace(config, weights_path=str(tmp_path))))
    *ranks, tp1 = streamed
    assert all(r < 0.45 * tp1 for r in ranks), streamed
