"""bench/results holds one file per measurement, the latest raw output of each under a name
that stays (git keeps the runs before); nothing is named after a period of work, and every
results file README.md, docs/, bench/README.md and bench/results/README.md cite exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = (ROOT / "README.md", ROOT / "bench" / "README.md", RESULTS / "README.md")
# A results file's name as the docs write it: in backticks or a link, or after bench/results/,
# with {a,b} alternatives; a folder of logs ends with `-logs/`.
CITED = re.compile(r"(?:bench/results/|results/|`|\[)((?:h200|h100|cpu)-[A-Za-z0-9{},._-]*?"
                   r"(?:\.txt|\.json|\.\{[a-z,]+\}|-logs/?))")
# Work periods, as names and text put them: session12a, session 12, the tenth session...
PERIOD = re.compile(r"session[-_ ]?\d|(?<![\w/])sessions?(?![\w.])|\b(third|fourth|fifth|"
                    r"sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth)\s+session",
                    re.I)


def expand(name: str) -> list[str]:
    """`a-{x,y}-k{0,3}.txt` as the four names it stands for."""
    match = re.search(r"\{([^{}]*)\}", name)
    if match is None:
        return [name]
    return [full for alt in match.group(1).split(",")
            for full in expand(name[:match.start()] + alt + name[match.end():])]


def cited(text: str) -> set[str]:
    return {name.rstrip("/") for raw in CITED.findall(text) for name in expand(raw)}


def test_citations_are_found_with_their_alternatives() -> None:
    text = ("see `h200-coverage-{triton,flashinfer}-k{0,3}.txt` and [x](bench/results/"
            "cpu-threads.txt), logs in `h200-time-to-ready-logs/`, `h200-kernels.{txt,json}`")
    assert cited(text) == {"h200-kernels.txt", "h200-kernels.json",
                           "h200-coverage-triton-k0.txt", "h200-coverage-triton-k3.txt",
                           "h200-coverage-flashinfer-k0.txt", "h200-coverage-flashinfer-k3.txt",
                           "cpu-threads.txt", "h200-time-to-ready-logs"}


def test_every_results_file_the_docs_cite_exists() -> None:
    for doc in (*DOCS, *sorted((ROOT / "docs").glob("*.md"))):
        names = cited(doc.read_text(encoding="utf-8"))
        assert names or doc not in DOCS, doc
        missing = sorted(n for n in names if not (RESULTS / n).exists())
        assert not missing, f"{doc.relative_to(ROOT)} cites {missing}"
    assert cited((ROOT / "docs" / "results.md").read_text(encoding="utf-8"))


def test_every_results_file_is_listed_in_the_results_readme() -> None:
    listed = cited((RESULTS / "README.md").read_text(encoding="utf-8").split("\n## ", 1)[0])
    present = {p.name for p in RESULTS.iterdir() if p.name != "README.md"}
    assert present == listed, (sorted(present - listed), sorted(listed - present))


def test_no_results_file_is_named_after_a_period_of_work() -> None:
    # Anywhere a "session" word; at the top also the old suffix, a number and a letter
    # (`-13a`); `-k3`, `-1b-` and the logs' `warm-2.log` are not periods.
    bad = [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if PERIOD.search(p.name)]
    bad += [p.name for p in RESULTS.iterdir() if re.search(r"-\d+[a-z]$", p.name.split(".")[0])]
    assert not bad, bad


def test_no_doc_names_a_period_of_work() -> None:
    docs = [*DOCS, *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
    bad = [f"{doc.relative_to(ROOT)}:{n}: {line.strip()}" for doc in docs
           for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
           if PERIOD.search(line)]
    assert not bad, "\n".join(bad)
