"""Command-line flags and their WARMGATE_ environment variables, generated from the config
dataclasses.

A setting that has a flag says so once, on its dataclass field:
`field(default=8, metadata=flag("--max-num-seqs", "requests per batch"))`. From that one
declaration come the argparse option, its environment variable (WARMGATE_ + the flag's name,
upper case: `--max-num-seqs` <- `WARMGATE_MAX_NUM_SEQS`), the help text with the default, and
the flag a ConfigError about the field names. Precedence: a flag beats its environment
variable, which beats the field's default.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from warmgate.server.config.flag_values import BY_ANNOTATION

ENV_PREFIX = "WARMGATE_"
PROG = "warmgate-server"
_FLAG = "warmgate.flag"
_FIELD_DEFAULT: Any = object()  # the field's own default is the flag's


@dataclass(frozen=True)
class FlagSpec:
    name: str
    help: str
    parse: Callable[[str], Any] | None
    default: Any
    # Whether the flag's value is the field's value; False where start-up builds the field
    # from it (--model names a preset or directory, --tls-cert a file to read).
    direct: bool
    # The ConfigError.field_name that blames this flag, when it is not the field's path.
    error_field: str | None


def flag(name: str, help: str, *, parse: Callable[[str], Any] | None = None,
         default: Any = _FIELD_DEFAULT, direct: bool = True,
         error_field: str | None = None) -> dict[str, FlagSpec]:
    """The field metadata declaring the field's flag."""
    return {_FLAG: FlagSpec(name, help, parse, default, direct, error_field)}


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    parse: Callable[[str], Any]
    default: Any
    is_bool: bool
    direct: bool
    # Where the value lands, from ServerConfig: "runner.scheduler.max_num_seqs".
    path: str
    error_field: str

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def options_of(cls: type, prefix: str = "") -> Iterator[Option]:
    """Every flagged field of `cls` and of the dataclasses nested in it, in field order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        spec: FlagSpec | None = f.metadata.get(_FLAG)
        if spec is None:
            if dataclasses.is_dataclass(hints[f.name]):
                yield from options_of(hints[f.name], path + ".")
            continue
        annotation = str(f.type)
        parse = spec.parse or BY_ANNOTATION[annotation]
        default = _field_default(f) if spec.default is _FIELD_DEFAULT else spec.default
        # Runner errors name fields from RunnerConfig ("cache.block_size"), the others from
        # ServerConfig ("serving.ngram_min").
        error_field = spec.error_field or path.removeprefix("runner.")
        yield Option(spec.name, spec.help, parse, default, annotation == "bool", spec.direct,
                     path, error_field)


def values_by_path(options: Sequence[Option], args: argparse.Namespace) -> dict[str, Any]:
    """{path: parsed value} of the options `args` has (a tool may add only some) whose value
    is their field's."""
    return {o.path: getattr(args, o.dest) for o in options
            if o.direct and hasattr(args, o.dest)}


def build(cls: type, values: Mapping[str, Any], prefix: str = "",
          given: Mapping[str, Any] | None = None) -> Any:
    """`cls` with every field whose path is in `given` or `values` set from it (nested
    dataclasses built the same way), the others at their defaults."""
    given = given or {}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        if path in given:
            kwargs[f.name] = given[path]
        elif path in values:
            kwargs[f.name] = values[path]
        elif dataclasses.is_dataclass(hints[f.name]) and \
                any(p.startswith(path + ".") for p in (*values, *given)):
            kwargs[f.name] = build(hints[f.name], values, path + ".", given)
    return cls(**kwargs)


def _argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn a ValueError's message into argparse's 'argument --x: ...' error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: {exc}") from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option],
                flags: Sequence[str], environ: Mapping[str, str],
                defaults: Mapping[str, Any] | None = None) -> None:
    """Add the named options to `parser`, each defaulting to its environment variable, else
    to `defaults[flag]`, else to its field's default."""
    by_flag = {opt.flag: opt for opt in options}
    unknown = [f for f in flags if f not in by_flag]
    if unknown:
        raise ValueError(f"no such server options: {', '.join(unknown)}")
    for name in flags:
        opt = by_flag[name]
        default = (defaults or {}).get(name, opt.default)
        raw = environ.get(opt.env)
        if raw is not None:
            try:
                default = opt.parse(raw)
            except ValueError as exc:
                parser.error(f"argument {opt.flag}: invalid value {raw!r} from {opt.env}: {exc}")
        text = f"{opt.help} (env {opt.env}; default {default})"
        if opt.is_bool:
            parser.add_argument(opt.flag, dest=opt.dest, default=default, help=text,
                                action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(opt.flag, dest=opt.dest, default=default, help=text,
                                type=_argtype(opt.parse))


def startup_error(message: str) -> NoReturn:
    """One line naming the flag (or file) on stderr, exit 2: a start-up that can never work
    says why in a line a log collector keeps whole, never with a usage dump or a traceback."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        startup_error(f"{message} (see {PROG} --help)")


def flag_for(options: Sequence[Option], error_field: str) -> str:
    """The flag a ConfigError's field_name blames; the name itself where no flag sets it."""
    return next((o.flag for o in options if o.error_field == error_field), error_field)
