"""--mode options: the first Generate that uses each sampling option after ready, against steady
requests with the same option, on ONE warmed `warmgate-server` process.

Usage: python bench/warm.py first-request --mode options --model-dir DIR
       [--write-checkpoint PRESET] [--server-args "--device cuda --attention-backend triton"]
       [--classes plain,logprobs,...] [--steady 10] [--prompt-len 128] [--max-tokens 16]
       [--gap-s 0.25] [--temperature 0.7] [--seeded] [--same-grammar] [--keep-caches]
       [--servers 1] [--shuffle] [--json] [--out FILE]

The model directory needs a tokenizer and EOS ids for the grammar classes:
--write-checkpoint PRESET writes PRESET's shapes with random weights, a small trained
tokenizer and EOS into it first (devtools.checkpoint; kept when there). The server starts
with --warmup-on-start and its metrics on a free port; once health is SERVING, each option
class in turn (plain first) sends the first request that uses the option since ready, then
--steady more with the same option, one at a time, each after --gap-s of idleness (as
--mode ttft: a step after a pause is slower than back to back). Per class: TTFT (client side:
sent -> first message with tokens) and whole-request time, first / steady median, the mean
decode step after the first token (a request that took more steps, fewer drafts accepted,
is not slower per step; requests outside the grammar classes set ignore_eos, so each has
decode steps to time), the tokens and steps produced, and the server's JIT compiles and
CUDA-graph misses after ready from its
/metrics before and after the class (so a compile after ready is charged to the class whose
requests caused it). Every request has a fresh random prompt; a grammar class gives each
request its own grammar text (a different literal), so first and steady requests alike pay
xgrammar's compile of a new grammar and the ratio shows only first-use costs
(--same-grammar: one text per class, compiled by the first request alone).
Unless --keep-caches, the server gets empty TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR (a
kernel the warmup missed cannot come from another run's cache); FlashInfer's JIT cache
(FLASHINFER_WORKSPACE_BASE) is kept: it is per machine, and the warmup's flashinfer phase
loads it whatever the options.
Only one request per server can be first, so one ratio holds one request's noise: --servers N
runs the whole class sequence on N fresh servers in turn (each with empty caches of its own
unless --keep-caches; compiles they pay in warmup are before ready and not counted), the same
requests on each; --shuffle draws each server's class order (plain stays first), so a class is
not always measured right after the same neighbour. Per class: each server's first/steady
ratio, their median, and the median of the N first requests over the median of all the steady
ones (first_request_options_report.py); the JSON keeps every server's requests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from first_request_generate import _warm_client
from first_request_options_report import ClassResult, Timed, print_table, summarise, worst
from load_gen import positive_int, typed

from warmgate.server.devtools.server_process import ServerProcess

START_TIMEOUT_S = 300.0
METRICS_PORT = re.compile(r"metrics on http://\S+:(\d+)/metrics")
AFTER_READY = {
    "compiles": re.compile(r'^warmgate_jit_compiles_total\{[^}]*after_ready="true"[^}]*\} (\S+)',
                           re.M),
    "graph_misses": re.compile(
        r'^warmgate_cuda_graph_misses_total\{[^}]*after_ready="true"[^}]*\} (\S+)', re.M),
}
GRAMMAR_CLASSES = ("json_schema", "regex", "ebnf")
CLASSES = ("plain", "logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "min_p", "min_tokens", "logit_bias", *GRAMMAR_CLASSES)


def _grammar(kind: str, i: int) -> str:
    """Request i's grammar of `kind`: the same shape, a literal of its own."""
    if kind == "json_schema":
        return json.dumps({"type": "object", "properties": {
            "ok": {"type": "boolean"}, "kind": {"enum": [f"a{i}", "b"]}},
            "required": ["ok", "kind"], "additionalProperties": False})
    if kind == "regex":
        return rf"(yes|no|r{i}), [0-9]{{2}}!"
    return (f'root ::= "[" item ("," item)? "]"\n'
            f'item ::= "red" | "green" | "c{i}" | [0-9]')


def option_kwargs(name: str, i: int, max_tokens: int, vocab: int, rng: random.Random,
                  same_grammar: bool) -> dict[str, Any]:
    """Generate keywords of request i of class `name` (beside temperature etc.)."""
    if name == "plain":
        return {}
    if name in ("logprobs", "prompt_logprobs"):
        return {name: 5}
    if name in ("presence_penalty", "frequency_penalty"):
        return {name: 0.5}
    if name == "repetition_penalty":
        return {name: 1.2}
    if name == "min_p":
        return {name: 0.1}
    if name == "min_tokens":  # these stop ids masked for half the tokens
        return {name: max_tokens // 2, "stop_token_ids": [1, 2]}
    if name == "logit_bias":
        return {name: {rng.randrange(vocab): rng.choice((-100.0, -5.0, 5.0)) for _ in range(8)}}
    return {name: _grammar(name, 0 if same_grammar else i)}


def request_kwargs(name: str, i: int, args: argparse.Namespace, vocab: int,
                   rng: random.Random) -> dict[str, Any]:
    """Every keyword of request i of class `name`. A request outside the grammar classes
    ignores EOS: one that drew EOS as its first token would have no decode step to time, and
    first and steady requests then produce the same number of tokens. A grammar request ends
    when its grammar does, which takes several tokens for each of GRAMMAR_CLASSES."""
    return {"temperature": args.temperature, "max_tokens": args.max_tokens,
            "ignore_eos": name not in GRAMMAR_CLASSES,
            **({"seed": rng.randrange(2**31)} if args.seeded else {}),
            **option_kwargs(name, i, args.max_tokens, vocab, rng, args.same_grammar)}


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, required=True,
                   help="the server's --model: a HF directory with a tokenizer")
    p.add_argument("--write-checkpoint", metavar="PRESET",
                   help="first write PRESET's shapes (random weights, tokenizer, EOS) into "
                        "--model-dir (kept when there)")
    p.add_argument("--server-args", default="", help="more warmgate-server flags, one string")
    p.add_argument("--classes", default=",".join(CLASSES),
                   help=f"comma-separated, in order (default all: {','.join(CLASSES)})")
    p.add_argument("--steady", type=typed(positive_int), default=10,
                   help="steady requests per class after its first")
    p.add_argument("--prompt-len", type=typed(positive_int), default=128)
    p.add_argument("--max-tokens", type=typed(positive_int), default=16)
    p.add_argument("--gap-s", type=float, default=0.25, help="idle seconds before each request")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="of every request (min_p needs one above 0)")
    p.add_argument("--seeded", action="store_true",
                   help="every request with a seed of its own (the seeded sampler path)")
    p.add_argument("--same-grammar", action="store_true",
                   help="one grammar text per grammar class (cached after its first request)")
    p.add_argument("--keep-caches", action="store_true",
                   help="leave TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR as they are")
    p.add_argument("--servers", type=typed(positive_int), default=1,
                   help="fresh servers in turn, each running every class")
    p.add_argument("--shuffle", action="store_true",
                   help="each server's class order drawn at random (plain first)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--json", action="store_true", help="print one JSON object, no table")
    p.add_argument("--out", default=None, help="also write the JSON object to this file")
    return p


def scrape_metrics(metrics_port: int) -> str:
    """The server's /metrics page, as Prometheus would read it."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()  # type: ignore[no-any-return]


def _after_ready(metrics_port: int) -> dict[str, float]:
    text = scrape_metrics(metrics_port)
    return {k: sum(float(v) for v in pattern.findall(text))
            for k, pattern in AFTER_READY.items()}


def _timed(client: Any, prompt: list[int], kwargs: dict[str, Any], timeout: float) -> Timed:
    from warmgate.v1 import generate_pb2 as gen_pb

    start = time.perf_counter()
    first: float | None = None
    tokens, server_ttft, finish, steps = 0, float("nan"), "", 0
    for message in client.generate(prompt, timeout=timeout, **kwargs):
        if first is None and message.token_ids:
            first = time.perf_counter() - start
        tokens += len(message.token_ids)
        if message.HasField("usage"):
            server_ttft = message.usage.time_to_first_token_s
            steps = message.usage.num_steps
            finish = gen_pb.FinishReason.Name(message.finish_reason)
    total = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return Timed(first, total, server_ttft, tokens, finish, steps,
                 (total - first) / max(1, steps - 1))


def _run_class(client: Any, name: str, args: argparse.Namespace, vocab: int,
               metrics_port: int) -> ClassResult:
    from warmgate.client.errors import WarmgateRpcError

    rng = random.Random(f"{args.seed}/{name}")
    result = ClassResult(name)
    before = _after_ready(metrics_port)
    try:
        for i in range(1 + args.steady):
            kwargs = request_kwargs(name, i, args, vocab, rng)
            prompt = [rng.randrange(1, vocab) for _ in range(args.prompt_len)]
            time.sleep(args.gap_s)
            timed = _timed(client, prompt, kwargs, args.request_timeout)
            if i == 0:
                result.first = timed
            else:
                result.steady.append(timed)
    except WarmgateRpcError as exc:
        result.error = f"{exc.code.name}: {exc}"
    after = _after_ready(metrics_port)
    result.compiles_after_ready = after["compiles"] - before["compiles"]
    result.graph_misses_after_ready = after["graph_misses"] - before["graph_misses"]
    return result


def _caches_env(keep: bool, root: str) -> dict[str, str]:
    if keep:
        return {}
    return {var: os.path.join(root, var.lower())
            for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}


def _order(classes: list[str], shuffle: bool, seed: int, server: int) -> list[str]:
    """Server `server`'s class order: as given, or (--shuffle) drawn with plain first."""
    if not shuffle:
        return list(classes)
    head = [c for c in classes if c == "plain"]
    rest = [c for c in classes if c != "plain"]
    random.Random(f"{seed}/order/{server}").shuffle(rest)
    return head + rest


def _run_server(flags: list[str], order: list[str], args: argparse.Namespace,
                vocab: int) -> tuple[dict[str, Any], dict[str, ClassResult]]:
    """One fresh server: ready, then every class of `order` in turn."""
    from warmgate.client.api import WaitResult, WarmgateClient

    results: dict[str, ClassResult] = {}
    with tempfile.TemporaryDirectory(prefix="warmgate-options-caches-") as caches, \
            ServerProcess(flags, _caches_env(args.keep_caches, caches), device=None,
                          start_timeout_s=START_TIMEOUT_S, stop_signal=signal.SIGTERM
                          ) as server, \
            WarmgateClient(server.target, timeout=args.ready_timeout) as client:
        metrics_port = int(server.wait_for(METRICS_PORT).group(1))
        if client.wait_ready(args.ready_timeout) is not WaitResult.READY:
            raise SystemExit("not ready: " + client.get_status().failure_reason + "\n"
                             + server.log_tail())
        ready_s = time.perf_counter() - server.started
        status = client.get_status()
        _warm_client(client)
        at_ready = _after_ready(metrics_port)
        for name in order:
            results[name] = _run_class(client, name, args, vocab, metrics_port)
        misses_status = client.get_status().cuda_graph_misses_after_ready
    return {"device": status.device, "attention_backend": status.attention_backend,
            "ready_s": round(ready_s, 3), "order": order,
            "phases": {p.name: pb_status(p) for p in status.last_report.phases},
            "after_ready_at_ready": at_ready,
            "classes": [r.to_dict() for r in results.values()],
            "compiles_after_ready": sum(r.compiles_after_ready for r in results.values()),
            "graph_misses_after_ready": sum(r.graph_misses_after_ready
                                            for r in results.values()),
            "graph_misses_after_ready_status": misses_status}, results


def main(argv: list[str], prog: str | None = None) -> int:
    args = _parser(prog).parse_args(argv)
    classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    unknown = sorted(set(classes) - set(CLASSES))
    if unknown or not classes:
        raise SystemExit(f"--classes: unknown {unknown}; choose from {', '.join(CLASSES)}")
    flags = ["--model", str(args.model_dir), *shlex.split(args.server_args),
             "--metrics-port", "0", "--warmup-on-start"]
    if args.write_checkpoint:  # on the GPU when there is one; the server casts on load
        from warmgate.server.devtools.checkpoint import write_checkpoint

        print(write_checkpoint(args.write_checkpoint, args.model_dir, "auto", "auto",
                               tokenizer=True), flush=True)
    from warmgate.server.startup import load_server_config  # no torch

    config = load_server_config(flags, environ=os.environ, resolve=False)
    vocab = config.runner.model.vocab_size
    servers: list[dict[str, Any]] = []
    per_class: dict[str, list[ClassResult]] = {name: [] for name in classes}
    for i in range(args.servers):
        server, results = _run_server(flags, _order(classes, args.shuffle, args.seed, i),
                                      args, vocab)
        servers.append(server)
        for name, result in results.items():
            per_class[name].append(result)
        if args.servers > 1:
            print(f"server {i + 1}/{args.servers} done: ready in {server['ready_s']:.1f} s",
                  file=sys.stderr, flush=True)
    summaries = [summarise(name, per_class[name]) for name in classes]
    report = {
        "setup": {"model_dir": str(args.model_dir), "server_args": flags,
                  "device": servers[0]["device"],
                  "attention_backend": servers[0]["attention_backend"],
                  "num_speculative_steps": config.runner.speculative.num_speculative_steps,
                  "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
                  "steady": args.steady, "gap_s": args.gap_s,
                  "temperature": args.temperature, "seeded": args.seeded,
                  "same_grammar": args.same_grammar, "keep_caches": args.keep_caches,
                  "servers": args.servers, "shuffle": args.shuffle, "seed": args.seed},
        "classes": summaries,
        "worst": {a: worst(summaries, a) for a in ("ttft_s", "total_s", "decode_step_s")},
        "compiles_after_ready": sum(s["compiles_after_ready"] for s in servers),
        "graph_misses_after_ready": sum(s["graph_misses_after_ready"] for s in servers),
        "graph_misses_after_ready_status": sum(s["graph_misses_after_ready_status"]
                                               for s in servers),
        "servers": servers,
    }
    text = json.dumps(report)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print_table(report)
    return 1 if any(c["error"] for c in summaries) else 0


def pb_status(phase: Any) -> str:
    from warmgate.v1 import warmup_pb2 as pb

    return str(pb.PhaseStatus.Name(phase.status)).removeprefix("PHASE_STATUS_")
