"""deploy/Dockerfile, read as text (no docker daemon here): every Python the GPU image installs
from apt comes with its headers, because Triton compiles its launcher against Python.h at the
first kernel launch, i.e. during warmup; and the venv the image runs is that Python."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stages() -> dict[str, str]:
    """Stage name -> its instructions, with line continuations joined."""
    text = (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    out: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if match:
            name = match.group(1)
        out[name] = out.get(name, "") + line + "\n"
    return out


def apt_packages(stage: str) -> set[str]:
    packages: set[str] = set()
    for command in re.findall(r"apt-get install ([^&\n]*)", stage):
        packages |= {w for w in command.split() if not w.startswith("-")}
    return packages


def test_gpu_image_installs_python_headers_with_its_python() -> None:
    gpu = stages()["runtime-gpu"]
    packages = apt_packages(gpu)
    pythons = {p for p in packages if re.fullmatch(r"python3\.\d+", p)}
    assert pythons, f"runtime-gpu installs no python3.X from apt: {sorted(packages)}"
    for python in pythons:
        assert f"{python}-dev" in packages, f"runtime-gpu installs {python} without its headers"
    venv = re.search(r"(python3\.\d+) -m venv", gpu)
    assert venv is not None and venv.group(1) in pythons


def test_every_stage_that_installs_a_python_installs_its_headers() -> None:
    for name, stage in stages().items():
        packages = apt_packages(stage)
        for python in (p for p in packages if re.fullmatch(r"python3\.\d+", p)):
            assert f"{python}-dev" in packages, f"{name}: {python} without {python}-dev"


def test_pip_installs_compile_bytecode_where_python_writes_none() -> None:
    # A runtime that never writes .pyc (PYTHONDONTWRITEBYTECODE, files owned by root) starts
    # from the .pyc the image holds; pip writes them unless told --no-compile (or its env var).
    for name, stage in stages().items():
        if "pip install" not in stage:
            continue
        assert "--no-compile" not in stage and "PIP_NO_COMPILE" not in stage, name
        if name.startswith("runtime"):
            assert "PYTHONDONTWRITEBYTECODE=1" in stage, name
