"""`warmgate cache ls|prune`: inspect and trim a compile cache directory (--cache-dir).

Works on the local filesystem only (no server, no torch). `prune --keep N` keeps the N most
recently used READY entries and removes the rest, except any whose lock is held (a server
using it or a warmup filling it). Exit codes: 0 done, 4 the directory does not exist (the
CLI's EXIT_LOCAL), 64 a bad --keep, or no directory: the server has no default cache
directory, so neither has this; --cache-dir defaults to WARMGATE_CACHE_DIR, as the server's.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from warmgate.client import cache_fs

ENV_CACHE_DIR = "WARMGATE_CACHE_DIR"
EXIT_OK, EXIT_NO_DIR, EXIT_BAD_KEEP, EXIT_NO_CACHE_DIR = 0, 4, 64, 64


def add_cache_command(subparsers: Any, environ: Mapping[str, str]) -> argparse.ArgumentParser:
    cache = subparsers.add_parser("cache", help="list or prune a local compile cache directory")
    verbs = cache.add_subparsers(dest="cache_command", required=True)
    default = environ.get(ENV_CACHE_DIR)
    for name, text in (("ls", "list the entries, most recently used first"),
                       ("prune", "remove all but the N most recently used READY entries")):
        verb = verbs.add_parser(name, help=text)
        verb.add_argument("--cache-dir", default=default, metavar="D",
                          help=f"the cache directory (default ${ENV_CACHE_DIR}, as "
                               "warmgate-server's; one of the two is required)")
        verb.add_argument("--json", dest="cache_json", action="store_true",
                          help="print JSON")
        if name == "prune":
            verb.add_argument("--keep", type=int, required=True, metavar="N")
    return cache


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _ls(root: Path, as_json: bool, out: TextIO) -> None:
    entries = cache_fs.list_entries(root)
    if as_json:
        print(json.dumps([e.to_dict() for e in entries], sort_keys=True), file=out)
        return
    print(f"{'ENTRY':16}  {'STATE':10}  {'SIZE':>10}  {'LAST USED':19}  DETAIL", file=out)
    for e in entries:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used))
        detail = e.problem or (f"warmup {e.ready.get('warmup_seconds', '?')} s"
                               if e.ready else "")
        print(f"{e.name:16}  {e.state:10}  {_human(e.size_bytes):>10}  {used:19}  {detail}",
              file=out)


def run_cache(args: argparse.Namespace, *, out: TextIO, err: TextIO,
              as_json: bool = False) -> int:
    if args.cache_dir is None:
        print(f"warmgate cache {args.cache_command}: no cache directory: pass --cache-dir D "
              f"or set {ENV_CACHE_DIR} (as for warmgate-server)", file=err)
        return EXIT_NO_CACHE_DIR
    root = Path(args.cache_dir)
    as_json = as_json or args.cache_json
    if not root.is_dir():
        print(f"warmgate: cache directory {root} does not exist", file=err)
        return EXIT_NO_DIR
    if args.cache_command == "ls":
        _ls(root, as_json, out)
        return EXIT_OK
    if args.keep < 0:
        print("warmgate: --keep must be >= 0", file=err)
        return EXIT_BAD_KEEP
    result = cache_fs.prune(root, args.keep)
    if as_json:
        print(json.dumps(vars(result), sort_keys=True), file=out)
    else:
        print(f"removed {len(result.removed)}, kept {len(result.kept)}, in use (skipped) "
              f"{len(result.in_use)}" + "".join(f"\n  in use: {n}" for n in result.in_use),
              file=out)
    return EXIT_OK
