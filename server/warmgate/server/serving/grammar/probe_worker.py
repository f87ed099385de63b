"""The compile probes' process: a zygote that forks a probe per compile slot, so that the
server can kill a compile and have a fresh probe in milliseconds.

`python -m warmgate.server.serving.grammar.probe_worker --control-fd F`, started by
probe_pool.py. It imports xgrammar (and so torch: seconds) once, at the server's start-up,
then reads one line of JSON on stdin, {"tokenizer_info": xgrammar's TokenizerInfo JSON,
"max_threads": n}, and says {"ready": true} on the control socket F (SOCK_SEQPACKET: one
message each). After that, on F:

- {"fork": true} with a socket passed alongside (SCM_RIGHTS): a probe forked to serve on that
  socket; answered {"pid": pid}. The probe has everything loaded already: it only builds its
  compiler (its threads are its own, made after the fork).
- {"kill": pid}: SIGKILL to that probe, if it is still one of ours (its exit not yet collected,
  so its pid cannot belong to another process).
- end of file (the server stopped or died): every probe killed, and the zygote exits.

A probe reads lines of JSON on its socket: {"kind", "text", "json_whitespace"}, answered by
{"verdict": "ok", "seconds", "bytes"} or {"verdict": "invalid", "message"}; the first line it
writes is {"ready": true}. The compiled grammar stays in the probe and is dropped: only the
verdict and the time go back (see probe_pool.py for why).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import time
from typing import IO, Any

import xgrammar as xgr

from warmgate.server.serving.grammar.front_end import (
    check_compiled,
    check_grammar,
    check_text,
    parse,
)
from warmgate.server.serving.grammar.spec import GrammarError, GrammarSpec, one_line

PR_SET_PDEATHSIG = 1
CONTROL_MESSAGE_BYTES = 4096


def answer(compiler: xgr.GrammarCompiler, request: dict[str, Any]) -> dict[str, Any]:
    spec = GrammarSpec(request["kind"], request["text"], bool(request["json_whitespace"]))
    start = time.perf_counter()
    try:
        check_text(spec)
        grammar = parse(spec)
        check_grammar(spec, grammar)
        compiled = compiler.compile_grammar(grammar)
        seconds = time.perf_counter() - start
        check_compiled(spec, compiled)
    except GrammarError as exc:
        return {"verdict": "invalid", "message": exc.message}
    except Exception as exc:  # xgrammar's compile errors, worded as front_end words them
        return {"verdict": "invalid", "message": f"not a valid {spec.kind}: {one_line(exc)}"}
    return {"verdict": "ok", "seconds": seconds, "bytes": int(compiled.memory_size_bytes)}


def serve(compiler: xgr.GrammarCompiler, requests: IO[str], replies: IO[str]) -> None:
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        replies.write(json.dumps(answer(compiler, json.loads(line))) + "\n")
        replies.flush()


def _die_with_parent() -> None:
    """SIGKILL when the parent goes (the zygote for a probe, the server for the zygote)."""
    parent = os.getppid()
    # Not Linux: end of file on the sockets still ends us.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def _probe(info: xgr.TokenizerInfo, max_threads: int, conn: socket.socket) -> None:
    """In the forked child: serve compiles on `conn` until its end of file."""
    _die_with_parent()
    compiler = xgr.GrammarCompiler(info, max_threads=max_threads, cache_enabled=False)
    with conn.makefile("r", encoding="utf-8") as requests, \
            conn.makefile("w", encoding="utf-8") as replies:
        serve(compiler, requests, replies)


def _reap(live: set[int]) -> None:
    while live:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            live.clear()
            return
        if pid == 0:
            return
        live.discard(pid)


def zygote(control: socket.socket, setup_line: str) -> None:
    setup = json.loads(setup_line)
    info = xgr.TokenizerInfo.deserialize_json(setup["tokenizer_info"])
    max_threads = int(setup["max_threads"])
    control.send(json.dumps({"ready": True}).encode())
    live: set[int] = set()
    while True:
        data, fds, _, _ = socket.recv_fds(control, CONTROL_MESSAGE_BYTES, 1)
        _reap(live)
        if not data:
            break
        message = json.loads(data)
        if "fork" in message:
            conn = socket.socket(fileno=fds[0])
            pid = os.fork()
            if pid == 0:
                control.close()
                code = 0
                try:
                    _probe(info, max_threads, conn)
                except BaseException:  # the server sees its socket close and replaces it
                    code = 1
                os._exit(code)
            conn.close()
            live.add(pid)
            control.send(json.dumps({"pid": pid}).encode())
        elif "kill" in message and int(message["kill"]) in live:
            os.kill(int(message["kill"]), signal.SIGKILL)
        for fd in fds[1:] if "fork" in message else fds:
            os.close(fd)
    for pid in live:
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m warmgate.server.serving.grammar."
                                          "probe_worker")
    parser.add_argument("--control-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    # Anything that writes to fd 1 (a library's print) goes to stderr, the server's log.
    os.dup2(2, 1)
    control = socket.socket(fileno=args.control_fd)
    setup_line = sys.stdin.readline()
    if setup_line:  # none: the server stopped before it had a vocabulary to send
        zygote(control, setup_line)


if __name__ == "__main__":
    main()
