"""Prompts and chat messages to token ids exactly as transformers' AutoTokenizer gives them,
and the load errors of a model directory's tokenizer, chat template and EOS ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tests.grpc_harness import run, server_config
from tests.text_helpers import (
    CHATML_TEMPLATE,
    MULTIBYTE_TEXT,
    smollm2_dir,
    train_tokenizer,
    write_text_files,
    write_tiny_model,
)
from warmgate.server.app import create_server
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.text.errors import PromptError, TextLoadError
from warmgate.server.text.model_text import load_model_text
from warmgate.server.text.tokenizer import TextTokenizer

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "  c \n\n"}],
    [{"role": "user", "content": MULTIBYTE_TEXT}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "<|im_end|> inside content, {{ not a template }}"}],
]
PROMPTS = ["Hello world", " leading space", MULTIBYTE_TEXT, "The capital of France is"]
# Exercises what transformers gives a template beyond plain jinja2: the special tokens,
# raise_exception, namespace, the tojson filter, loop controls and the generation block.
RICH_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(turns=0) %}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{% set ns.turns = ns.turns + 1 %}{% if m['content'] == 'skip' %}{% continue %}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}"
    "{% else %}{{ m['content'] | tojson }}{% endif %}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant ({{ ns.turns }} turns)\n{% endif %}")

# Block tags on lines of their own, indented: what trim_blocks and lstrip_blocks are for.
MULTILINE_TEMPLATE = """{% for m in messages %}
  {% if m['role'] == 'system' %}
[SYS] {{ m['content'] }}
  {% else %}
<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""


def reference_chat_ids(directory: Path, messages: list[dict[str, str]]) -> list[int]:
    hf = AutoTokenizer.from_pretrained(directory)
    return list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                       return_dict=False))


def check_against_transformers(directory: Path, chats: list[list[dict[str, str]]]) -> None:
    ours = TextTokenizer.load(directory, 10**6)
    assert ours is not None
    hf = AutoTokenizer.from_pretrained(directory)
    for messages in chats:
        assert ours.encode_chat(messages) == reference_chat_ids(directory, messages), messages
    for text in PROMPTS:
        assert ours.encode_prompt(text) == hf(text)["input_ids"], text


@pytest.mark.parametrize("template", [CHATML_TEMPLATE, MULTILINE_TEMPLATE],
                         ids=["chatml", "multiline"])
@pytest.mark.parametrize("kind", ["byte_level", "byte_fallback"])
def test_chat_and_prompt_ids_equal_transformers(tmp_path: Path, kind: str,
                                                template: str) -> None:
    directory = write_text_files(tmp_path, train_tokenizer(kind), chat_template=template)
    check_against_transformers(directory, CHATS)


def test_transformers_template_globals_and_the_tokenizer_config_key(tmp_path: Path) -> None:
    directory = write_text_files(tmp_path, train_tokenizer("byte_level"), chat_template=None)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = RICH_TEMPLATE  # no chat_template.jinja: the key is read
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    chats = [*CHATS, [{"role": "user", "content": "skip"}, {"role": "user", "content": "x"}]]
    check_against_transformers(directory, chats)
    ours = TextTokenizer.load(directory, 10**6)
    assert ours is not None and ours.chat_template is not None
    assert "tokenizer_config.json: chat_template" in ours.chat_template.origin
    with pytest.raises(PromptError, match="unknown role tool") as info:
        ours.encode_chat([{"role": "tool", "content": "x"}])
    assert info.value.fields == ("messages",)


@pytest.mark.slow
def test_smollm2_chat_and_prompt_ids_equal_transformers() -> None:
    check_against_transformers(smollm2_dir(), CHATS)


def test_a_directory_without_a_template_refuses_messages(tmp_path: Path) -> None:
    directory = write_text_files(tmp_path, train_tokenizer("byte_level"), chat_template=None)
    ours = TextTokenizer.load(directory, 10**6)
    assert ours is not None and ours.chat_template is None
    with pytest.raises(PromptError, match="no chat template"):
        ours.encode_chat(CHATS[0])
    assert ours.encode_prompt("Hello")  # a text prompt still works


def one_line_error(tmp_path: Path, vocab_size: int = 10**6) -> str:
    with pytest.raises(TextLoadError) as info:
        load_model_text(ModelConfig(weights_path=str(tmp_path), vocab_size=vocab_size))
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ValueError)
    return message


@pytest.mark.parametrize(("file", "content", "expected"), [
    ("tokenizer.json", "{ not json", "tokenizer.json: not a tokenizers file"),
    ("tokenizer.json", '{"model": {"type": "Nonsense"}}', "tokenizer.json: not a tokenizers"),
    ("chat_template.jinja", "{% for m in messages %}", "chat_template.jinja: not a valid "
                                                       "jinja2 template"),
    ("chat_template.jinja", b"\xff\xfe\x00", "chat_template.jinja: cannot be read"),
    ("tokenizer_config.json", "[1, 2]", "tokenizer_config.json: holds a JSON list"),
    ("tokenizer_config.json", '{"chat_template": 5}', "tokenizer_config.json: chat_template: "
                                                      "neither a template string"),
    ("tokenizer_config.json", '{"eos_token": 5}', "tokenizer_config.json: eos_token: 5 is "
                                                  "neither a string"),
    ("generation_config.json", '{"eos_token_id": "2"}',
     "generation_config.json: eos_token_id: '2' is not a token id"),
    ("generation_config.json", '{"eos_token_id": [1, true]}',
     "generation_config.json: eos_token_id: [1, True] is not a token id"),
    ("generation_config.json", "{,}", "generation_config.json: is not valid JSON"),
])
def test_an_unusable_file_fails_the_load_naming_it(tmp_path: Path, file: str,
                                                   content: str | bytes, expected: str) -> None:
    # chat_template.jinja, when there is one, wins over tokenizer_config.json's key.
    template_in_config = file == "tokenizer_config.json" and "chat_template" in str(content)
    write_text_files(tmp_path, train_tokenizer("byte_level"), eos_token_id=2,
                     **({"chat_template": None} if template_in_config else {}))
    path = tmp_path / file
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    message = one_line_error(tmp_path)
    assert f"{tmp_path}/{expected}" in message, message


def test_a_tokenizer_larger_than_the_model_vocabulary_fails_the_load(tmp_path: Path) -> None:
    write_text_files(tmp_path, train_tokenizer("byte_level"))
    message = one_line_error(tmp_path, vocab_size=100)
    assert "tokenizer.json: 372 tokens but the model's vocab_size is 100" in message


def test_eos_ids_outside_the_vocabulary_fail_the_load(tmp_path: Path) -> None:
    write_text_files(tmp_path, train_tokenizer("byte_level"), eos_token_id=[2, 9999])
    assert "generation_config.json: eos_token_id: [9999] outside the vocabulary [0, 512)" in \
        one_line_error(tmp_path, vocab_size=512)


@pytest.mark.parametrize(("generation_config", "config", "expected"), [
    ({"eos_token_id": [2, 7, 2]}, {"eos_token_id": 5}, (2, 7)),  # generation_config first
    ({"bos_token_id": 1}, {"eos_token_id": 5}, (5,)),  # no EOS there: config.json's
    (None, {"eos_token_id": [3, 4]}, (3, 4)),
    (None, {"eos_token_id": None}, ()),
    (None, {}, ()),
])
def test_eos_ids_come_from_generation_config_else_config(
        tmp_path: Path, generation_config: dict[str, object] | None, config: dict[str, object],
        expected: tuple[int, ...]) -> None:
    if generation_config is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation_config))
    (tmp_path / "config.json").write_text(json.dumps(config))
    text = load_model_text(ModelConfig(weights_path=str(tmp_path)))
    assert text.eos_token_ids == expected and text.tokenizer is None


def test_a_preset_has_no_text() -> None:
    text = load_model_text(ModelConfig.from_preset("tiny"))
    assert text.eos_token_ids == () and text.tokenizer is None and text.directory is None


def test_the_server_does_not_start_with_an_unusable_tokenizer(tmp_path: Path) -> None:
    """warmgate-server turns this ValueError into one line and exit 2 (as a ConfigError)."""
    write_tiny_model(tmp_path)
    (tmp_path / "tokenizer.json").write_text("garbage")
    with pytest.raises(TextLoadError, match=r"tokenizer\.json: not a tokenizers file"):
        run(create_server(server_config("--model", str(tmp_path))))


@pytest.mark.parametrize("template", [
    "{{ messages.append({'role': 'x'}) }}",  # the immutable environment: no mutation
    "{{ raise_exception('roles must alternate') }}",
    "{{ messages[5]['content'] }}",  # an undefined value used as a mapping
])
def test_a_template_that_fails_on_the_messages_is_the_requests_error(
        tmp_path: Path, template: str) -> None:
    directory = write_text_files(tmp_path, train_tokenizer("byte_level"), chat_template=template)
    ours = TextTokenizer.load(directory, 10**6)
    assert ours is not None
    with pytest.raises(PromptError, match=r"the model's chat template \(.*\) refused them") as info:
        ours.encode_chat(CHATS[0])
    assert info.value.fields == ("messages",)
