#!/usr/bin/env python3
"""Regenerate the checked-in gRPC/protobuf code from proto/ into a directory.

Usage: python tools/gen_proto.py [OUT_DIR]   (default: client/, where the code is checked in)

Runs grpc_tools' bundled protoc with `-Iproto`, so generated imports read
`from warmgate.v1 import ...`, and mypy-protobuf's plugins for the .pyi stubs. The plugins are
passed by absolute path so this works when the interpreter's scripts directory is not on PATH
(a venv that was not activated, a test subprocess).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
DEFAULT_OUT = REPO_ROOT / "client"
PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def _find_plugin(name: str) -> str:
    # Prefer the plugin installed next to this interpreter: a PATH hit could belong to another.
    candidate = Path(sysconfig.get_path("scripts")) / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install mypy-protobuf (the `test` extra)")
    return found


def generate(out_dir: Path) -> list[Path]:
    """Write every generated file for proto/ under out_dir; return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    protos = proto_files()
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}"]
    cmd += [f"--plugin={name}={_find_plugin(name)}" for name in PLUGINS]
    cmd += [f"--{kind}_out={out_dir}" for kind in ("python", "grpc_python", "mypy", "mypy_grpc")]
    cmd += [str(p) for p in protos]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT, capture_output=True, text=True)
    return expected_outputs(out_dir)


def expected_outputs(out_dir: Path) -> list[Path]:
    """The files protoc writes for each .proto: message code and service code, each with stubs."""
    outputs = []
    for proto in proto_files():
        stem = out_dir / proto.relative_to(PROTO_ROOT).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
            outputs.append(stem.with_name(stem.name + suffix))
    return outputs


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0]) if argv else DEFAULT_OUT
    for path in generate(out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
