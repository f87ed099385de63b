"""Model directories that say one thing twice, built by transformers and then edited: warmgate
either serves transformers' greedy tokens exactly (float32, 32 tokens, k=0 and k=3) or
refuses the directory with one line naming the key.

Each case is one a reader that picked the other key would serve differently: positions run
past the rope's original context (64), and the edits change the math if read the other way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.reference_helpers import hf_greedy, randomize_parameters, runner_for
from tests.serving_helpers import Served, greedy
from warmgate.server.config.hf_config import ModelLoadError, read_model_dir
from warmgate.server.config.runner_config import ModelConfig

transformers = pytest.importorskip("transformers")

MAX_POSITIONS = 256
PROMPT_LEN = 100
NEW_TOKENS = 32
VOCAB = 256
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
SIZES = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5,
         "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def _save(directory: Path, config_cls: str, model_cls: str, seed: int, **kwargs: Any) -> None:
    config = getattr(transformers, config_cls)(**{**SIZES, **kwargs})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    randomize_parameters(model)  # random norms and biases too: none skipped unseen
    model.save_pretrained(directory)


def _edit_config(directory: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))


def _edit_tensors(directory: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _llama(directory: Path, **kwargs: Any) -> None:
    _save(directory, "LlamaConfig", "LlamaForCausalLM", 3, **kwargs)


def both_rope_keys(d: Path) -> None:
    """The issue's file: transformers 5's llama3 rope_parameters plus a 4.x rope_scaling."""
    _llama(d, rope_parameters=dict(LLAMA3))
    _edit_config(d, lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 4.0}))


def both_rope_keys_agree(d: Path) -> None:
    _llama(d, rope_parameters=dict(LLAMA3))
    scaling = {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
    _edit_config(d, lambda c: c.update(rope_scaling=scaling, rope_theta=500000.0))


def theta_twice(d: Path) -> None:
    _llama(d, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    _edit_config(d, lambda c: c.update(rope_theta=2000.0))


def type_twice(d: Path) -> None:
    _llama(d, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0})
    _edit_config(d, lambda c: c["rope_parameters"].update(type="default"))


def original_context_twice(d: Path) -> None:
    _llama(d, rope_parameters=dict(LLAMA3))
    _edit_config(d, lambda c: c.update(original_max_position_embeddings=32))


def head_dim_over_hidden(d: Path) -> None:
    _llama(d, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})


def mistral_kv_heads_absent(d: Path) -> None:
    """MistralConfig's default is 8 KV heads, not num_attention_heads."""
    _save(d, "MistralConfig", "MistralForCausalLM", 5, num_attention_heads=16,
          num_key_value_heads=8, head_dim=8, sliding_window=None)
    _edit_config(d, lambda c: c.pop("num_key_value_heads"))


def dtype_twice(d: Path) -> None:
    _llama(d)
    _edit_config(d, lambda c: c.update(dtype="float32", torch_dtype="float16"))


def qwen2_window_off(d: Path) -> None:
    """A window shorter than the prompt, not applied: use_sliding_window is false."""
    _save(d, "Qwen2Config", "Qwen2ForCausalLM", 7, use_sliding_window=False)
    # Without the layer_types transformers saved, max_window_layers 0 makes every layer a
    # sliding one, were the window applied.
    _edit_config(d, lambda c: (c.update(sliding_window=16, max_window_layers=0),
                               c.pop("layer_types", None)))


def tied_over_a_different_head(d: Path) -> None:
    """transformers keeps the file's own head (and warns)."""
    _llama(d, tie_word_embeddings=False)
    _edit_config(d, lambda c: c.update(tie_word_embeddings=True))


def tied_over_an_equal_head(d: Path) -> None:
    _llama(d, tie_word_embeddings=True)

    def add_head(t: dict[str, torch.Tensor]) -> None:
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()

    _edit_tensors(d, add_head)


# case -> (build, what warmgate must have resolved)
SERVED: dict[str, tuple[Callable[[Path], None], Callable[[ModelConfig], bool]]] = {
    "both rope keys": (both_rope_keys, lambda m: (m.rope.rope_type, m.rope.theta)
                       == ("linear", 10000.0)),
    "both rope keys agree": (both_rope_keys_agree, lambda m: m.rope.rope_type == "llama3"),
    "rope_theta twice": (theta_twice, lambda m: m.rope.theta == 1000.0),
    "type and rope_type": (type_twice, lambda m: m.rope.rope_type == "linear"),
    "original context twice": (original_context_twice,
                               lambda m: m.rope.original_max_position_embeddings == 32),
    "head_dim over hidden/heads": (head_dim_over_hidden, lambda m: m.head_dim == 32),
    "mistral kv heads absent": (mistral_kv_heads_absent, lambda m: m.num_kv_heads == 8),
    "dtype and torch_dtype": (dtype_twice, lambda m: True),
    "qwen2 window off": (qwen2_window_off, lambda m: m.sliding_window is None),
    "tied over a different head": (tied_over_a_different_head,
                                   lambda m: not m.tie_word_embeddings),
    "tied over an equal head": (tied_over_an_equal_head, lambda m: m.tie_word_embeddings),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SERVED))
def test_served_tokens_equal_transformers(case: str, tmp_path: Path) -> None:
    build, resolved = SERVED[case]
    build(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32).eval()
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    want = hf_greedy(model, prompt, NEW_TOKENS)
    config, _ = read_model_dir(tmp_path)
    assert resolved(config), config
    for k in (0, 3):
        served = Served(runner_for(tmp_path, max_model_len=MAX_POSITIONS, num_spec=k))
        req = served.submit("r", prompt, greedy(NEW_TOKENS))
        served.run()
        assert req.output_token_ids == want, f"k={k}"


def mistral_window_ignored_flag(d: Path) -> None:
    """Mistral applies its window whatever use_sliding_window says: one shorter than the
    served length is sliding-window attention, which warmgate does not implement."""
    _save(d, "MistralConfig", "MistralForCausalLM", 5, sliding_window=MAX_POSITIONS)
    _edit_config(d, lambda c: c.update(sliding_window=16, use_sliding_window=False))


def model_type_disagrees(d: Path) -> None:
    _llama(d)
    _edit_config(d, lambda c: c.update(model_type="qwen2"))


REFUSED: dict[str, tuple[Callable[[Path], None], str]] = {
    "mistral window": (mistral_window_ignored_flag, "sliding_window"),
    "model_type vs architectures": (model_type_disagrees, "model_type"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_with_one_line_naming_the_key(case: str, tmp_path: Path) -> None:
    build, key = REFUSED[case]
    build(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        read_model_dir(tmp_path, max_model_len=MAX_POSITIONS)
    assert str(info.value).startswith(f"{tmp_path / 'config.json'}: {key}: ")
    assert "\n" not in str(info.value)
