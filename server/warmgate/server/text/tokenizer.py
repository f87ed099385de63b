"""The model directory's tokenizer (tokenizer.json, through the `tokenizers` package) and chat
template: prompts and chat messages to token ids exactly as transformers' AutoTokenizer gives
them, and detokenizers for response streams."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from warmgate.server.text.chat_template import (
    TOKENIZER_CONFIG_FILE,
    special_tokens_of,
    template_source,
)
from warmgate.server.text.detokenizer import DecodeTraits, IncrementalDetokenizer
from warmgate.server.text.errors import PromptError, TextLoadError
from warmgate.server.text.files import TOKENIZER_FILE, read_json_object
from warmgate.server.text.prompt_bound import max_prompt_bytes
from warmgate.server.text.template_process import BoundedChatTemplate, TemplateLimits

__all__ = ["TOKENIZER_FILE", "TextTokenizer"]

# Without a byte bound (prompt_bound), a rendered chat prompt is still cut at this many
# characters per token of max_model_len; the worker's memory bound holds below that.
FALLBACK_CHARS_PER_TOKEN = 1024
# For a tokenizer loaded without a model's max_model_len (tools, tests).
DEFAULT_MAX_MODEL_LEN = 1 << 17


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, source: str, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.chat_template: BoundedChatTemplate | None = None
        self._decode_traits = DecodeTraits.of(tokenizer)
        # The tokenizer file, for messages and logs.
        self.source = source
        # A prompt longer than this many UTF-8 bytes cannot fit max_model_len; None: no
        # such bound for this tokenizer, `prompt_bound_why` says why (or how it was found).
        self.max_prompt_bytes, self.prompt_bound_why = max_prompt_bytes(tokenizer,
                                                                         max_model_len)
        self.max_render_chars = self.max_prompt_bytes if self.max_prompt_bytes is not None \
            else max_model_len * FALLBACK_CHARS_PER_TOKEN

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @classmethod
    def load(cls, directory: Path, model_vocab_size: int, max_model_len: int | None = None,
             limits: TemplateLimits | None = None) -> TextTokenizer | None:
        """The directory's tokenizer, or None when it has no tokenizer.json; its chat
        template compiled within `limits` (TextLoadError past them)."""
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            return None
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception for a broken file
            raise TextLoadError(path, f"not a tokenizers file ({_one_line(exc)})") from None
        loaded = cls(tokenizer, str(path), max_model_len or DEFAULT_MAX_MODEL_LEN)
        # A token id at or past the model's vocabulary would index past its embedding.
        if loaded.vocab_size > model_vocab_size:
            raise TextLoadError(path, f"{loaded.vocab_size} tokens but the model's vocab_size "
                                      f"is {model_vocab_size}: not this model's tokenizer")
        config_path = directory / TOKENIZER_CONFIG_FILE
        config = read_json_object(config_path) if config_path.is_file() else {}
        found = template_source(directory, config)
        if found is not None:
            loaded.chat_template = BoundedChatTemplate(
                found[0], found[1], special_tokens_of(config, config_path),
                loaded.max_render_chars, limits or TemplateLimits())
        return loaded

    def check_prompt_size(self, text: str) -> None:
        """PromptError("prompt") when `text` is too long to fit max_model_len: cheap, so it
        runs before the tokenizer does."""
        bound = self.max_prompt_bytes
        # A character is at least one byte: the length alone refuses most, unencoded.
        if bound is None or len(text) <= bound // 4:
            return
        size = len(text) if len(text) > bound else len(text.encode("utf-8", "surrogatepass"))
        if size > bound:
            raise PromptError("prompt", f"{'over ' if len(text) > bound else ''}{size} bytes; "
                                        f"a prompt of more than {bound} bytes "
                                        f"({self.prompt_bound_why}) cannot fit in fewer "
                                        f"tokens than that")

    def encode_prompt(self, text: str) -> list[int]:
        """AutoTokenizer(text)["input_ids"]: with the special tokens the post-processor adds.
        PromptError when the text is too long to fit max_model_len."""
        self.check_prompt_size(text)
        return self._encode(text, add_special_tokens=True)

    def _encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        # encode_batch releases the GIL while the Rust side works (encode holds it): a long
        # prompt tokenized on a worker thread does not stall the event loop.
        [encoding] = self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    def encode_chat(self, messages: Sequence[Mapping[str, str]],
                    cancelled: threading.Event | None = None) -> list[int]:
        """apply_chat_template(messages, add_generation_prompt=True): the rendered text,
        tokenized without adding special tokens (the template writes them). RenderCancelled
        once `cancelled` is set (the request is gone: its render stops)."""
        if self.chat_template is None:
            raise PromptError("messages", f"the model directory has no chat template "
                                          f"(chat_template.jinja, or chat_template in "
                                          f"{TOKENIZER_CONFIG_FILE}); send prompt or "
                                          f"prompt_token_ids instead")
        text = self.chat_template.render(messages, cancelled)
        return self._encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, self._decode_traits,
                                      skip_special_tokens=True)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
