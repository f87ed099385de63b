"""The docs, benchmarks and deployment speak of the project alone: no issue or session numbers,
no section headed by the date of a piece of work, nothing about the time or the tooling of the
machines they were measured on, which a reader cannot look up.

Raw output in bench/results/ is exempt: those files are what a command printed, never edited
(bench/results/README.md says so), so only the prose there (its README) is checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TEXT_SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".json", ".txt", ""}

# Anywhere: in prose, comments and docstrings.
PHRASES = re.compile(r"\bissues?\s*#?\d+\b|\bsessions?\s*#?\d+\b|\bdevice[- ]time\b", re.I)
# In Markdown, also a heading that carries a date (a work period, not a subject) and the
# tooling that lent a GPU (its calls, its wheel tool, its output variable passed through).
DATED_HEADING = re.compile(r"^ {0,3}#{1,6} .*\b\d{4}-\d{2}-\d{2}\b")
TOOLING = re.compile(r"\bdevice[- ]calls?\b|device-wheels|OUT=\$OUT", re.I)


def checked_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in ("docs", "bench", "deploy"):
        for path in sorted((ROOT / folder).rglob("*")):
            raw = RESULTS in path.parents and path.suffix != ".md"
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not raw:
                files.append(path)
    return files


def offending_lines(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    markdown = path.suffix == ".md"
    return [f"{path.relative_to(root)}:{n}: {line.strip()}"
            for n, line in enumerate(text.splitlines(), 1)
            if PHRASES.search(line)
            or (markdown and (DATED_HEADING.search(line) or TOOLING.search(line)))]


def test_no_doc_names_an_issue_a_session_a_work_period_or_the_tooling() -> None:
    files = checked_files()
    assert RESULTS / "README.md" in files and len(files) > 50
    assert not any(RESULTS in f.parents and f.suffix == ".txt" for f in files)
    bad = [line for path in files for line in offending_lines(path)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(("name", "text"), [
    ("a.md", "The cache (issue 20) is shared."),
    ("a.sh", "# Issue 21's H200 evidence"),
    ("a.py", '"""Greedy tokens (Issue #23)."""'),
    ("a.md", "Measured in session 12."),
    ("a.md", "## 2026-12-02 12:54, first command"),
    ("a.md", "Only the kernel tests fit the device time that was left."),
    ("a.md", "in four device calls"),
    ("a.md", "    OUT=$OUT PARTS=tests bash bench/gpu_steady.sh"),
])
def test_each_kind_is_caught(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(f"fine line\n{text}\n", encoding="utf-8")
    assert offending_lines(path, tmp_path) == [f"{name}:2: {text.strip()}"]


def test_dated_rows_and_plain_words_pass(tmp_path: Path) -> None:
    """A date inside a table or a sentence is a fact about a run; "issue" as a verb, and a
    shell script passing its own OUT on, are fine."""
    path = tmp_path / "a.md"
    path.write_text("| `h200-kernels.txt` | run 1 (6217640) |\nmeasured 2026-12-02\n"
                    "the client's own time to issue N calls\n", encoding="utf-8")
    assert offending_lines(path, tmp_path) == []
    script = tmp_path / "a.sh"
    script.write_text("  OUT=$OUT PARTS=first bash bench/gpu_options.sh\n", encoding="utf-8")
    assert offending_lines(script, tmp_path) == []
