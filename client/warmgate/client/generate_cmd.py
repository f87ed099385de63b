"""`warmgate generate`: stream one request's tokens (or, for a text prompt, its text) and print
them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from warmgate.client import sampling_flags as flags
from warmgate.client.api import WarmgateClient
from warmgate.client.exit_codes import EXIT_LOCAL
from warmgate.client.generate import Generation


def token_ids(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; spaces are allowed, anything else (an empty item as in '1,,2',
    a negative or non-integer id) is an argparse error."""
    parts = text.replace(" ", "").split(",")
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated non-negative token ids like 1,2,3, got {text!r}")
    return [int(part) for part in parts]


def add_generate_command(commands: Any) -> None:
    gen = commands.add_parser(
        "generate", help="generate from a prompt (needs a ready server)",
        description="Stream the generated text (--prompt, --chat) or token ids (--prompt-ids, "
                    "comma-separated) to stdout as they arrive, and a summary to stderr; "
                    "--json prints one object instead. Text needs a model with a tokenizer.")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=token_ids, metavar="IDS",
                        help="prompt token ids, comma-separated")
    prompt.add_argument("--prompt", metavar="TEXT", help="a text prompt, tokenized as is")
    prompt.add_argument("--chat", metavar="TEXT",
                        help="one user message, rendered with the model's chat template")
    gen.add_argument("--max-tokens", type=flags.max_tokens, default=None, metavar="N",
                     help="tokens to generate at most (server default 16)")
    gen.add_argument("--temperature", type=flags.temperature, default=0.0, metavar="T",
                     help="0 (default) is greedy")
    gen.add_argument("--top-k", type=flags.top_k, default=0, metavar="K",
                     help="keep the K most likely tokens (0, the default, keeps all)")
    gen.add_argument("--top-p", type=flags.top_p, default=None, metavar="P", help="in (0, 1]")
    gen.add_argument("--seed", type=flags.seed, default=None, metavar="S",
                     help="makes a stochastic request reproducible")
    gen.add_argument("--stop-ids", type=token_ids, default=[], metavar="IDS",
                     help="stop after any of these token ids")
    gen.add_argument("--ignore-eos", action="store_true",
                     help="do not stop at the model's end-of-sequence ids")
    gen.add_argument("--logprobs", type=flags.logprobs, default=None, metavar="N",
                     help="return each token's log probability and the N most likely (0-20; "
                          "shown with --json)")
    gen.add_argument("--prompt-logprobs", type=flags.logprobs, default=None, metavar="N",
                     help="the same for every prompt token after the first")
    gen.add_argument("--presence-penalty", type=flags.penalty, default=0.0, metavar="X",
                     help="OpenAI's, in [-2, 2]")
    gen.add_argument("--frequency-penalty", type=flags.penalty, default=0.0, metavar="X",
                     help="OpenAI's, in [-2, 2]")
    gen.add_argument("--repetition-penalty", type=flags.repetition_penalty, default=None,
                     metavar="X", help="transformers', in [0.01, 100] (1 disables it)")
    gen.add_argument("--min-p", type=flags.min_p, default=0.0, metavar="P", help="in [0, 1]")
    gen.add_argument("--min-tokens", type=flags.min_tokens, default=0, metavar="N",
                     help="no end-of-sequence or stop id before N tokens")
    gen.add_argument("--logit-bias", type=flags.logit_bias_item, action="append", default=[],
                     metavar="ID=BIAS", help="add BIAS (in [-100, 100]) to token ID's logit; "
                                             "repeat for more ids")
    structured = gen.add_mutually_exclusive_group()
    structured.add_argument("--json-schema", metavar="FILE",
                            help="structured output: the output is JSON valid against the "
                                 "JSON schema in FILE")
    structured.add_argument("--regex", metavar="R",
                            help="structured output: the output matches the regular "
                                 "expression R")
    structured.add_argument("--grammar", metavar="FILE",
                            help="structured output: the output matches the EBNF grammar "
                                 "(GBNF, with a root rule) in FILE")


def _structured(args: argparse.Namespace) -> dict[str, str]:
    """The structured-output option as generate_request's keyword; OSError for a file that
    cannot be read."""
    if args.json_schema is not None:
        return {"json_schema": Path(args.json_schema).read_text(encoding="utf-8")}
    if args.grammar is not None:
        return {"ebnf": Path(args.grammar).read_text(encoding="utf-8")}
    return {"regex": args.regex} if args.regex is not None else {}


def run_generate(client: WarmgateClient, args: argparse.Namespace, out: TextIO,
                 err: TextIO) -> int:
    result = Generation()
    as_text = args.prompt_ids is None
    try:
        structured = _structured(args)
    except OSError as exc:
        print(f"warmgate: cannot read {exc.filename}: {exc.strerror}", file=err)
        return EXIT_LOCAL
    stream = client.generate(args.prompt_ids or (), prompt=args.prompt,
                             messages=[{"role": "user", "content": args.chat}]
                             if args.chat is not None else (),
                             timeout=args.rpc_timeout, max_tokens=args.max_tokens,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                             seed=args.seed, stop_token_ids=args.stop_ids,
                             ignore_eos=args.ignore_eos, logprobs=args.logprobs,
                             prompt_logprobs=args.prompt_logprobs,
                             presence_penalty=args.presence_penalty,
                             frequency_penalty=args.frequency_penalty,
                             repetition_penalty=args.repetition_penalty, min_p=args.min_p,
                             min_tokens=args.min_tokens, logit_bias=dict(args.logit_bias),
                             **structured)
    for message in stream:
        if args.json:
            pass  # one object at the end
        elif as_text:
            print(message.text, end="", file=out, flush=True)
        elif message.token_ids:
            prefix = "," if result.token_ids else ""
            print(prefix + ",".join(map(str, message.token_ids)), end="", file=out, flush=True)
        result.add(message)
    if args.json:
        print(json.dumps(result.to_dict()), file=out)
        return 0
    print(file=out)
    usage = result.usage
    if usage is not None:
        drafts = (f", drafts {usage.num_accepted_draft_tokens}/{usage.num_draft_tokens} "
                  "accepted" if usage.num_draft_tokens else "")
        print(f"# {usage.completion_tokens} tokens, finish {result.finish_reason}, "
              f"time to first token {1e3 * usage.time_to_first_token_s:.1f} ms, "
              f"{usage.num_steps} steps{drafts}", file=err)
    return 0
