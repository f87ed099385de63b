"""The chat template's worker process: compiles the model's template once, then renders
requests' messages, one at a time, under limits its server cannot enforce on a thread.

A C-level allocation (`'x' * 10**9` through a filter) or a loop of 10**10 iterations cannot be
interrupted inside the interpreter that runs it; in this process, the address-space limit
turns the first into a MemoryError, and the server (text.template_process) kills it at the
render's deadline. RLIMIT_CPU, raised before each request to the CPU time used so far plus
that request's budget, also ends a render whose server is gone.

Protocol, on stdin and stdout: each message a 4-byte big-endian length and UTF-8 JSON. The
worker says {"ready": true} once imported, then answers each request ({"op": "compile",
"source", "origin", "special_tokens", "max_chars"} or {"op": "render", "messages"}) with
{"text": ...} or {"error": kind, "message": ...}. JSON, not pickle: the server must not run
what a template that escaped its sandbox could write here.
"""

from __future__ import annotations

import json
import math
import os
import resource
import struct
import sys
from typing import Any, BinaryIO

from warmgate.server.text.chat_template import ChatTemplate
from warmgate.server.text.errors import PromptError, TextLoadError
from warmgate.server.text.template_sandbox import RenderBoundError

HEADER = struct.Struct(">I")
# An error's text is for one log line and one status message.
MAX_MESSAGE_CHARS = 500


def read_message(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message, or None at the end of the stream."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    message: dict[str, Any] = json.loads(data)
    return message


def encode_message(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(data)) + data


def _cpu_used_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _limit_cpu(budget_s: float) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(_cpu_used_s() + budget_s) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _answer(request: dict[str, Any], template: ChatTemplate | None
            ) -> tuple[dict[str, Any], ChatTemplate | None]:
    try:
        if request["op"] == "compile":
            template = ChatTemplate(request["source"], request["origin"],
                                    request["special_tokens"], request["max_chars"])
            return {"text": ""}, template
        if template is None:
            return {"error": "protocol", "message": "render before compile"}, None
        return {"text": template.render(request["messages"])}, template
    except RenderBoundError as exc:
        return {"error": exc.bound, "message": str(exc)}, template
    except MemoryError:
        return {"error": "memory", "message": "it needed more memory than its limit"}, template
    except TextLoadError as exc:
        return {"error": "compile", "message": str(exc)}, template
    except PromptError as exc:
        return {"error": "template", "message": _short(exc.message)}, template
    except Exception as exc:  # every failure of the template's code is an answer
        # OverflowError (range past jinja's MAX_RANGE), RecursionError (a recursive macro),
        # ZeroDivisionError, ...: the template failed on these messages.
        return {"error": "template", "message": _short(f"{type(exc).__name__}: {exc}")}, \
            template


def _short(text: str) -> str:
    return text[:MAX_MESSAGE_CHARS] + "..." if len(text) > MAX_MESSAGE_CHARS else text


def main(argv: list[str]) -> int:
    memory_bytes = int(argv[1])
    cpu_s = float(argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # The protocol owns stdout; anything else printing goes to stderr.
    reader = sys.stdin.buffer
    writer = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr
    writer.write(encode_message({"ready": True}))
    writer.flush()
    template: ChatTemplate | None = None
    while (request := read_message(reader)) is not None:
        _limit_cpu(cpu_s)
        reply, template = _answer(request, template)
        writer.write(encode_message(reply))
        writer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
