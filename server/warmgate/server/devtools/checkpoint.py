"""A checkpoint directory of a preset's shapes with random weights (safetensors, HF layout),
so start-up and load can be measured and tested without a model hub: bench/start.py time-to-ready
and the start-up tests write one; with `tokenizer=True` it also gets a small trained tokenizer
and EOS ids (devtools.text_files), so text and structured-output paths run on it
(bench/warm.py coverage and bench/warm.py first-request --mode options)."""

from __future__ import annotations

import time
from pathlib import Path


def write_checkpoint(preset: str, model_dir: Path, device: str, dtype: str, *,
                     tokenizer: bool = False) -> str:
    """A safetensors directory of the preset's shapes, random weights (reused if present);
    with `tokenizer`, tokenizer files beside them (added to a reused directory too). device
    and dtype may be "auto" (as the server's flags)."""
    from warmgate.server.config.runner_config import ModelConfig

    config = ModelConfig.from_preset(preset)
    text = ""
    if tokenizer:
        from warmgate.server.devtools.text_files import write_tokenizer

        text = "; " + write_tokenizer(model_dir, config.vocab_size)
    if (model_dir / "config.json").exists() and list(model_dir.glob("*.safetensors")):
        return f"reused {model_dir}{text}"
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":  # what the server's auto picks for the device
        dtype = "float32" if device == "cpu" else "bfloat16"
    from warmgate.server.runner.model import LlamaModel
    from warmgate.server.runner.ops import TorchOps
    from warmgate.server.runner.weights import init_random_weights, save_weights

    start = time.monotonic()
    model = LlamaModel(config, TorchOps(), None, torch.device(device), getattr(torch, dtype))
    init_random_weights(model, seed=0)
    # Shards of at most 5 GB, as the Hugging Face checkpoints of these models come.
    files = save_weights(model, config, model_dir, max_shard_bytes=5 * 10**9)
    size = sum(f.stat().st_size for f in files)
    return (f"wrote {preset} to {model_dir}: {len(files)} files, {size / 1e9:.2f} GB in "
            f"{time.monotonic() - start:.1f} s{text}")
