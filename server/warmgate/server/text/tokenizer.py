"""The model directory's tokenizer (tokenizer.json, through the `tokenizers` package) and chat
template: prompts and chat messages to token ids exactly as transformers' AutoTokenizer gives
them, and detokenizers for response streams."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from warmgate.server.text.chat_template import (
    TOKENIZER_CONFIG_FILE,
    ChatTemplate,
    special_tokens_of,
)
from warmgate.server.text.detokenizer import DecodeTraits, IncrementalDetokenizer
from warmgate.server.text.errors import PromptError, TextLoadError
from warmgate.server.text.files import TOKENIZER_FILE, read_json_object

__all__ = ["TOKENIZER_FILE", "TextTokenizer"]


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, chat_template: ChatTemplate | None,
                 source: str) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self._decode_traits = DecodeTraits.of(tokenizer)
        # The tokenizer file, for messages and logs.
        self.source = source

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @classmethod
    def load(cls, directory: Path, model_vocab_size: int) -> TextTokenizer | None:
        """The directory's tokenizer, or None when it has no tokenizer.json."""
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            return None
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception for a broken file
            raise TextLoadError(path, f"not a tokenizers file ({_one_line(exc)})") from None
        config_path = directory / TOKENIZER_CONFIG_FILE
        config = read_json_object(config_path) if config_path.is_file() else {}
        template = ChatTemplate.load(directory, config,
                                     special_tokens_of(config, config_path))
        loaded = cls(tokenizer, template, str(path))
        # A token id at or past the model's vocabulary would index past its embedding.
        if loaded.vocab_size > model_vocab_size:
            raise TextLoadError(path, f"{loaded.vocab_size} tokens but the model's vocab_size "
                                      f"is {model_vocab_size}: not this model's tokenizer")
        return loaded

    def encode_prompt(self, text: str) -> list[int]:
        """AutoTokenizer(text)["input_ids"]: with the special tokens the post-processor adds."""
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """apply_chat_template(messages, add_generation_prompt=True): the rendered text,
        tokenized without adding special tokens (the template writes them)."""
        if self.chat_template is None:
            raise PromptError("messages", f"the model directory has no chat template "
                                          f"(chat_template.jinja, or chat_template in "
                                          f"{TOKENIZER_CONFIG_FILE}); send prompt or "
                                          f"prompt_token_ids instead")
        text = self.chat_template.render(messages)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, self._decode_traits,
                                      skip_special_tokens=True)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
