"""A GenerateRequest's prompt, whichever of its three forms it came in, as token ids."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from warmgate.server.core.errors import ResourceExhausted
from warmgate.server.text.errors import PromptError, RenderBusy
from warmgate.server.text.files import TOKENIZER_FILE
from warmgate.server.text.model_text import ModelText
from warmgate.v1 import generate_pb2 as gen_pb

PROMPT_FIELDS = ("prompt_token_ids", "prompt", "messages")
# Off the event loop: tokenizing (which releases the GIL) here, and chat template renders
# (which wait on a worker process) on the template's own threads (text.template_process),
# so text prompts never queue behind renders waiting out their time bound.
_TOKENIZE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tokenize")


def _fields_set(request: gen_pb.GenerateRequest) -> list[str]:
    present = {"prompt_token_ids": bool(request.prompt_token_ids),
               "prompt": request.HasField("prompt"), "messages": bool(request.messages)}
    return [name for name in PROMPT_FIELDS if present[name]]


def prompt_token_ids(request: gen_pb.GenerateRequest, text: ModelText,
                     cancelled: threading.Event | None = None) -> tuple[str, list[int]]:
    """(the field the prompt came in, its token ids); PromptError naming the field.
    `cancelled`: set once the request is gone, which stops its chat template's render."""
    fields = _fields_set(request)
    if not fields:
        raise PromptError("prompt_token_ids", "must hold at least one token id (or send a "
                                              "text prompt or chat messages instead)")
    if len(fields) > 1:
        raise PromptError(tuple(fields), f"set exactly one of {', '.join(PROMPT_FIELDS)}; this "
                                     f"request sets {' and '.join(fields)}")
    field = fields[0]
    if field == "prompt_token_ids":
        return field, list(request.prompt_token_ids)
    tokenizer = text.tokenizer
    if tokenizer is None:
        where = f"the model directory {text.directory}" if text.directory else \
            "this model (a preset, no directory)"
        raise PromptError(field, f"{where} has no {TOKENIZER_FILE}, so it takes "
                                 "prompt_token_ids only")
    if field == "prompt":
        ids = tokenizer.encode_prompt(request.prompt)
    else:
        for i, m in enumerate(request.messages):
            if not m.role:
                raise PromptError(f"messages[{i}].role", "must not be empty")
        ids = tokenizer.encode_chat([{"role": m.role, "content": m.content}
                                     for m in request.messages], cancelled)
    if not ids:
        raise PromptError(field, "encodes to no tokens; at least one is needed")
    return field, ids


async def prompt_token_ids_async(request: gen_pb.GenerateRequest, text: ModelText
                                 ) -> tuple[str, list[int]]:
    """prompt_token_ids, with only the size checks on the event loop: a text prompt too long
    to fit max_model_len is refused before it is tokenized."""
    tokenizer = text.tokenizer
    fields = _fields_set(request)
    if tokenizer is None or len(fields) != 1 or fields[0] == "prompt_token_ids":
        return prompt_token_ids(request, text)
    if fields[0] == "prompt":
        tokenizer.check_prompt_size(request.prompt)
        return await asyncio.get_running_loop().run_in_executor(_TOKENIZE, prompt_token_ids,
                                                                request, text)
    template = tokenizer.chat_template
    if template is None:  # the PromptError saying so
        return prompt_token_ids(request, text)
    try:
        future, cancelled = template.submit(
            lambda cancelled: prompt_token_ids(request, text, cancelled))
    except RenderBusy as exc:
        raise ResourceExhausted(str(exc)) from None
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        # The client left (or its deadline passed): a render waiting for a worker is not
        # started, one running has its worker killed (text.template_process).
        cancelled.set()
        raise
