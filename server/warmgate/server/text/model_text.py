"""What the serving path knows about a model's text: its EOS ids and, when the directory has
tokenizer.json, its tokenizer and chat template. Loaded once, at server start-up."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from warmgate.server.config.model_files import ModelFileError, check_inside_model_dir
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.config.serving_config import ServingConfig
from warmgate.server.text.eos import read_eos_token_ids
from warmgate.server.text.errors import TextLoadError
from warmgate.server.text.files import TOKENIZER_FILE

if TYPE_CHECKING:  # imported (with tokenizers and jinja2) only for a directory that has one
    from warmgate.server.text.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelText:
    # Requests stop at these unless they set ignore_eos; empty for presets and random weights.
    eos_token_ids: tuple[int, ...] = ()
    # None: the model has no tokenizer.json, so requests send token ids only.
    tokenizer: TextTokenizer | None = None
    # The model directory, for messages; None for presets.
    directory: str | None = None


def load_model_text(model: ModelConfig, serving: ServingConfig | None = None) -> ModelText:
    """The model directory's EOS ids and tokenizer, its chat template compiled within the
    bounds `serving` sets; TextLoadError (a ValueError naming the file and key) when one of
    its files is unusable."""
    if model.weights_path is None:
        logger.info("text: model %s has random weights and no directory: token ids only, no "
                    "EOS ids", model.name)
        return ModelText()
    directory = Path(model.weights_path)
    try:
        check_inside_model_dir(directory)
    except ModelFileError as exc:
        raise TextLoadError(exc.path, exc.detail) from None
    eos, eos_source = read_eos_token_ids(directory, model.vocab_size)
    tokenizer = None
    if (directory / TOKENIZER_FILE).is_file():
        # tokenizers and jinja2 (the chat template) are imported only when there is a
        # tokenizer: a start-up without one need not pay for them.
        from warmgate.server.text.template_process import TemplateLimits
        from warmgate.server.text.tokenizer import TextTokenizer

        serving = serving if serving is not None else ServingConfig()
        limits = TemplateLimits(serving.chat_template_timeout_s,
                                serving.chat_template_memory_mib, serving.chat_template_workers,
                                serving.chat_template_queue)
        tokenizer = TextTokenizer.load(directory, model.vocab_size, model.max_model_len, limits)
    template = tokenizer.chat_template if tokenizer is not None else None
    logger.info("text: %s; %s; EOS ids %s",
                f"{tokenizer.source} ({tokenizer.vocab_size} tokens; prompt byte bound "
                f"{tokenizer.max_prompt_bytes}: {tokenizer.prompt_bound_why})"
                if tokenizer is not None
                else f"no {TOKENIZER_FILE}: token ids only",
                f"chat template {template.origin}" if template is not None
                else "no chat template",
                f"{list(eos)} from {eos_source}" if eos else "none (generation stops only at "
                "max_tokens, stop_token_ids and max_model_len)")
    return ModelText(eos, tokenizer, str(directory))
