"""The dispatcher behind bench/'s entry points (warm.py, start.py, serve.py, load.py): each
answers one question and runs one of the scripts in this folder per command, as Python runs a
script, so each keeps its own flags, `--help` and exit code.

    python bench/ENTRY.py                 the entry's question and its commands
    python bench/ENTRY.py COMMAND --help  the command's flags
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

LIB = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Command:
    script: str  # a file of bench/lib/
    prints: str  # what it answers with, one line


def usage(entry: str, doc: str, commands: dict[str, Command]) -> str:
    width = max(map(len, commands))
    rows = [f"  {name:{width}}  {c.prints}" for name, c in commands.items()]
    return "\n".join([f"usage: python {entry} COMMAND [flags]   "
                      f"(python {entry} COMMAND --help: its flags)", "", doc.strip(), "",
                      "commands:", *rows])


def _run_as_main(path: Path) -> None:
    """Run path as `python path` would, but with sys.argv[0] left as the entry's command
    (runpy would set it to path), so usage lines show the command a user types."""
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module  # for dataclasses and pickling, which look it up
    try:
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    finally:
        sys.modules["__main__"] = saved


def run(entry: str, doc: str, commands: dict[str, Command], argv: list[str]) -> int:
    """Run commands[argv[0]] with the rest of argv; usage on -h, or 2 on no/unknown command."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(entry, doc, commands), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"{entry}: unknown command {name!r}; one of {', '.join(commands)}",
              file=sys.stderr)
        return 2
    # argparse names the program after argv[0]'s last part: "warm.py coverage".
    sys.argv = [f"{entry} {name}", *rest]
    if str(LIB) not in sys.path:
        sys.path.insert(0, str(LIB))  # the script's imports of its neighbours, as when run
    try:
        _run_as_main(LIB / commands[name].script)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0
