"""The checked-in generated code is exactly what tools/gen_proto.py makes from proto/."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED_IN = ROOT / "client"


def _gen_proto_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "tools" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools comes with the test extra")
    pytest.importorskip("mypy_protobuf", reason="mypy-protobuf comes with the test extra")
    gen = _gen_proto_module()
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_proto.py"), str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    expected = sorted(p.relative_to(tmp_path) for p in gen.expected_outputs(tmp_path))
    assert fresh == expected, "protoc wrote files tools/gen_proto.py does not know about"
    stale = [str(rel) for rel in fresh
             if not (CHECKED_IN / rel).is_file()
             or (CHECKED_IN / rel).read_bytes() != (tmp_path / rel).read_bytes()]
    assert not stale, (f"generated code is out of date: {stale}; "
                       "run `python tools/gen_proto.py` and commit the result")
    checked_in = sorted(p.relative_to(CHECKED_IN) for p in (CHECKED_IN / "warmgate" / "v1")
                        .rglob("*") if p.is_file() and "__pycache__" not in p.parts
                        and p.name != "py.typed")  # PEP 561's marker, not generated
    assert checked_in == fresh, "client/warmgate/v1 holds files proto/ no longer generates"
