"""The compile probe: a child process that compiles grammars so that the server can kill one.

`python -m warmgate.server.serving.grammar.probe_worker`, started by probe_pool.py. Lines of
JSON on stdin and stdout: first {"tokenizer_info": xgrammar's TokenizerInfo JSON,
"max_threads": n}, then per grammar {"kind", "text", "json_whitespace"} answered by
{"verdict": "ok", "seconds", "bytes"} or {"verdict": "invalid", "message"}. The compiled
grammar stays here and is dropped: only the verdict and the time go back (see
probe_pool.py for why).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO, Any

import xgrammar as xgr

from warmgate.server.serving.grammar.front_end import check_grammar, check_text, parse
from warmgate.server.serving.grammar.spec import GrammarError, GrammarSpec, one_line


def answer(compiler: xgr.GrammarCompiler, request: dict[str, Any]) -> dict[str, Any]:
    spec = GrammarSpec(request["kind"], request["text"], bool(request["json_whitespace"]))
    start = time.perf_counter()
    try:
        check_text(spec)
        grammar = parse(spec)
        check_grammar(spec, grammar)
        compiled = compiler.compile_grammar(grammar)
    except GrammarError as exc:
        return {"verdict": "invalid", "message": exc.message}
    except Exception as exc:  # xgrammar's compile errors, worded as front_end words them
        return {"verdict": "invalid", "message": f"not a valid {spec.kind}: {one_line(exc)}"}
    return {"verdict": "ok", "seconds": time.perf_counter() - start,
            "bytes": int(compiled.memory_size_bytes)}


def serve(requests: IO[str], replies: IO[str]) -> None:
    setup = json.loads(requests.readline())
    info = xgr.TokenizerInfo.deserialize_json(setup["tokenizer_info"])
    compiler = xgr.GrammarCompiler(info, max_threads=int(setup["max_threads"]),
                                   cache_enabled=False)
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        replies.write(json.dumps(answer(compiler, json.loads(line))) + "\n")
        replies.flush()


def main() -> None:
    # The replies get stdout's descriptor to themselves: anything else that writes to fd 1
    # (a library's print) goes to stderr instead of into the protocol.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
