"""README.md's Quick start and `warmgate` examples, as a newcomer runs them: two commands, one
torch spec, the one-liner guarded against another server's answers, every `warmgate`
invocation shown (in README.md, docs/ and deploy/README.md) accepted by the CLI's parser as
written, every bench script they name runnable from the repository root, every docs page
linked from README.md, and the wheel's file name as the build writes it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_harness import load_script, user_env
from warmgate.client.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The pages README.md links, where the rest of what it used to hold now lives.
DOCS = [ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def quick_start() -> list[str]:
    section = README.split("## Quick start", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the Quick start has a ```sh block"
    return block.group(1).strip().splitlines()


def warmgate_invocations(line: str) -> list[list[str]]:
    """Each `warmgate ...` command in a shell line, split at ; && || ( ) and #."""
    line = line.split(" #", 1)[0]
    out = []
    for part in re.split(r"&&|\|\||;|\(|\)|\|", line):
        words = shlex.split(part)
        if words and words[0] == "warmgate":
            out.append(words[1:])
    return out


def test_readme_opens_with_the_quick_start() -> None:
    """A newcomer reads the two commands first: the title, at most a short paragraph, then
    the Quick start as the first section."""
    sections = re.findall(r"^## (.+)$", README, re.M)
    assert sections[0] == "Quick start", sections[:3]
    before = README.split("## Quick start", 1)[0]
    assert len(before.strip().splitlines()) <= 3, before


def test_quick_start_is_two_commands_with_one_torch_spec() -> None:
    lines = quick_start()
    assert len(lines) == 2, lines
    specs = [re.findall(r"\btorch[=<>!~][^\s'\"]*", line) for line in lines]
    assert specs[0] == specs[1] == ["torch==2.13.0"], specs


def test_ci_runs_the_quick_start_test_command_verbatim() -> None:
    assert quick_start()[1] in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_one_liner_checks_its_own_server_answers() -> None:
    """Every warmgate command after the server starts carries its pid (WARMGATE_SERVER_PID,
    exported right after `warmgate-server ... &`), so a stranger on 50051 fails them."""
    line = quick_start()[0]
    start = line.index("warmgate-server ")
    export = line.index("export WARMGATE_SERVER_PID=$!")
    first_client = line.index("warmgate ", start + len("warmgate-server "))
    assert start < export < first_client
    assert line[start:export].rstrip().endswith("&")
    commands = warmgate_invocations(line)
    assert [c[0] for c in commands] == ["wait", "status", "generate"]
    # Chained with &&: a wrong server (exit 3) or a failed wait stops the line there.
    assert "wait --timeout 300 && warmgate status && warmgate generate" in line


def examples() -> list[list[str]]:
    found = [c for line in quick_start() for c in warmgate_invocations(line)]
    # Lines of code blocks elsewhere, unless they are a synopsis ([optional], a|b, N, S).
    for text in (README, *(doc.read_text(encoding="utf-8") for doc in DOCS)):
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in block.splitlines():
                synopsis = "[" in line or "|" in line or any(
                    re.fullmatch(r"[A-Z]+", w) for w in line.split())
                if line.startswith("warmgate ") and not synopsis:
                    found += warmgate_invocations(line)
    return found


@pytest.mark.parametrize("argv", examples(), ids=lambda argv: " ".join(argv))
def test_every_example_parses_as_written(argv: list[str]) -> None:
    args = build_parser({"WARMGATE_SERVER_PID": "4242"}).parse_args(
        [a.replace("$WARMGATE_SERVER_PID", "4242") for a in argv])
    assert args.command == argv[0] or args.command in argv


def test_generate_json_after_the_command_as_the_readme_shows() -> None:
    args = build_parser({}).parse_args(["generate", "--prompt-ids", "1,2,3", "--max-tokens",
                                        "16", "--temperature", "0.8", "--seed", "7", "--json"])
    assert args.json and args.prompt_ids == [1, 2, 3]


BENCH_README = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
ENTRIES = ("warm", "start", "serve", "load")


def bench_commands() -> list[list[str]]:
    """Every bench command README.md, docs/ and bench/README.md show (and the GPU scripts
    run), as `python bench/ENTRY.py [COMMAND] --help`; first-request once more per mode it is
    shown with, `... first-request --mode M --help`."""
    pages = [*DOCS, *sorted((ROOT / "bench").glob("*.sh"))]
    text = " ".join((README + BENCH_README + "".join(
        p.read_text(encoding="utf-8") for p in pages)).split())
    found = set(re.findall(r"(?<![\w/])bench/([a-z_]+)\.py(?: ([a-z][a-z-]*))?", text))
    commands = sorted([f"bench/{name}.py", *([command] if command else []), "--help"]
                      for name, command in found)
    modes = {m for group in re.findall(r"first-request --mode ([a-z|]+)", text)
             for m in group.split("|")}
    commands += [["bench/warm.py", "first-request", "--mode", m, "--help"]
                 for m in sorted(modes)]
    return commands


def entry_commands(entry: str) -> dict[str, object]:
    commands: dict[str, object] = load_script(f"bench/{entry}.py").COMMANDS
    return commands


def test_the_docs_show_every_entry_command_and_first_request_mode() -> None:
    """bench/README.md's table lists each entry's every command, and the first-request modes
    README and bench/README show are all of them (a new mode or command gets its row)."""
    shown = {tuple(c[:2]) for c in bench_commands()}
    for entry in ENTRIES:
        assert (f"bench/{entry}.py", "--help") in shown, entry
        for command in entry_commands(entry):
            assert (f"bench/{entry}.py", command) in shown, (entry, command)
            assert f"`python bench/{entry}.py {command}" in BENCH_README, (entry, command)
    modes = {c[3] for c in bench_commands() if "--mode" in c}
    assert modes == set(load_script("bench/lib/first_request.py").MODES), modes


@pytest.mark.slow
def test_every_bench_command_runs_from_the_repository_root() -> None:
    """As a user runs them after the Quick start (`python bench/x.py` from the root, the
    editable install's path and nothing else): all at once, each must print its usage."""
    commands = bench_commands()
    assert len(commands) > 20, commands
    procs = [subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=user_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for argv in commands]
    failed = []
    for argv, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=240)
        if proc.returncode != 0 or "usage:" not in out:
            failed.append(f"python {' '.join(argv)}: exit {proc.returncode}\n{err[-2000:]}")
    assert not failed, "\n".join(failed)


def test_the_readme_links_every_docs_page() -> None:
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", README))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), pages - linked
    assert all((ROOT / page).is_file() for page in linked), linked


def test_the_wheel_named_in_the_docs_is_the_one_the_build_writes() -> None:
    """`warmgate-VERSION-py3-none-any.whl` as README.md, docs/ and deploy/README.md spell it:
    the version pyproject.toml gives (a release changes them together)."""
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(
        encoding="utf-8"), re.M)
    assert version is not None
    named = {v for text in (README, *(doc.read_text(encoding="utf-8") for doc in DOCS))
             for v in re.findall(r"warmgate-([\w.]+)-py3-none-any\.whl", text)}
    assert named == {version.group(1)}, named
