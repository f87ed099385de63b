"""`warmgate generate`'s sampling flags: a value the server would refuse is a bad command line
(exit 64, the flag and the range named, no RPC made), like every other bad command line; the
client's ranges are the server's."""

from __future__ import annotations

import contextlib
import io

import pytest

from warmgate.client import sampling_flags
from warmgate.client.cli import build_parser, main
from warmgate.client.exit_codes import EXIT_USAGE
from warmgate.server.api import sampling_options
from warmgate.server.config import sampling_limits

# A port nothing listens on: a command that got past the parser would fail with exit 3.
NOWHERE = "127.0.0.1:9"


def cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = main(["--target", NOWHERE, "generate", "--prompt-ids", "1,2,3", *argv],
                        out=io.StringIO(), err=err, environ={})
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, err.getvalue()


@pytest.mark.parametrize(("argv", "message"), [
    (["--temperature", "-1"], "argument --temperature: must be in [0, inf), got '-1'"),
    (["--temperature", "nan"], "argument --temperature: must be a finite number, got 'nan'"),
    (["--top-p", "0"], "argument --top-p: must be in (0, 1], got '0'"),
    (["--top-p", "1.5"], "argument --top-p: must be in (0, 1], got '1.5'"),
    (["--top-k", "-1"], "argument --top-k: must be in [0, 2147483647], got '-1'"),
    (["--max-tokens", "0"], "argument --max-tokens: must be in [1, 2147483647], got '0'"),
    (["--seed", "-7"], "argument --seed: must be in [0, 18446744073709551615], got '-7'"),
    (["--logprobs", "21"], "argument --logprobs: must be in [0, 20], got '21'"),
    (["--prompt-logprobs", "-1"], "argument --prompt-logprobs: must be in [0, 20], got '-1'"),
    (["--presence-penalty", "2.5"], "argument --presence-penalty: must be in [-2, 2]"),
    (["--frequency-penalty", "-3"], "argument --frequency-penalty: must be in [-2, 2]"),
    (["--repetition-penalty", "0"], "argument --repetition-penalty: must be in [0.01, 100]"),
    (["--min-p", "1.1"], "argument --min-p: must be in [0, 1], got '1.1'"),
    (["--min-tokens", "-1"], "argument --min-tokens: must be in [0, 2147483647], got '-1'"),
    (["--logit-bias", "42=101"], "argument --logit-bias: bias must be in [-100, 100], got "
                                 "'42=101'"),
    (["--logit-bias", "42=inf"], "argument --logit-bias: bias must be in [-100, 100]"),
    (["--max-tokens", "4", "--min-tokens", "5"],
     "argument --min-tokens: must be at most --max-tokens (4), got 5"),
    ([f"--logit-bias={i}=1" for i in range(301)],
     "argument --logit-bias: 301 token ids, at most 300"),
])
def test_a_bad_sampling_flag_exits_64_naming_it(argv: list[str], message: str) -> None:
    code, err = cli(*argv)
    assert code == EXIT_USAGE, err
    assert message in err and "usage:" in err, err


def test_the_ends_of_each_range_are_accepted() -> None:
    args = build_parser({}).parse_args([
        "generate", "--prompt-ids", "1", "--temperature", "0", "--top-p", "1", "--top-k", "0",
        "--max-tokens", "1", "--min-tokens", "1", "--seed", str(2**64 - 1), "--logprobs", "20",
        "--prompt-logprobs", "0", "--presence-penalty", "-2", "--frequency-penalty", "2",
        "--repetition-penalty", "0.01", "--min-p", "1", "--logit-bias", "7=-100",
        "--logit-bias", "7=100"])
    assert (args.temperature, args.top_p, args.repetition_penalty, args.seed) == (
        0.0, 1.0, 0.01, 2**64 - 1)
    assert sampling_flags.cross_check(args) is None
    # A large temperature is a near-uniform draw, not an error (the server sets no upper bound).
    assert build_parser({}).parse_args(
        ["generate", "--prompt-ids", "1", "--temperature", "1e30"]).temperature == 1e30


def test_the_clients_ranges_are_the_servers() -> None:
    assert sampling_flags.MAX_LOGPROBS == sampling_limits.MAX_LOGPROBS
    assert sampling_flags.MAX_ABS_PENALTY == sampling_limits.MAX_ABS_PENALTY
    assert sampling_flags.MAX_REPETITION_PENALTY == sampling_limits.MAX_REPETITION_PENALTY
    assert sampling_limits.float32(sampling_flags.MIN_REPETITION_PENALTY) == \
        sampling_limits.MIN_REPETITION_PENALTY
    assert sampling_flags.MAX_ABS_LOGIT_BIAS == sampling_limits.MAX_ABS_LOGIT_BIAS
    assert sampling_flags.MAX_LOGIT_BIAS_ENTRIES == sampling_options.MAX_LOGIT_BIAS_ENTRIES
