"""bench/start.py ready-ab: the two trees alternate which starts first, each server imports its own
tree, and a whole CPU comparison (this checkout against a copy of itself) runs end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_harness import ROOT, load_script, run_bench
from warmgate.server.devtools.server_process import ServerProcess

# A line only the base tree's copy prints at start-up, to tell which tree a server ran.
BASE_MARK = "ready_ab test: the base tree"


def _bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "lib"))  # as bench/start.py has it
    return load_script("bench/lib/ready_ab.py")


def test_the_sides_alternate_and_the_ratio_is_of_medians(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench(monkeypatch)
    assert bench.order(0) == ["base", "new"] and bench.order(1) == ["new", "base"]
    out = bench.summary({"base": [4.0, 2.0, 3.0], "new": [3.0, 1.0, 1.5]})
    assert out["median"] == {"base": 3.0, "new": 1.5} and out["new_over_base"] == 0.5


def test_each_server_imports_its_own_tree_first(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    bench = _bench(monkeypatch)
    monkeypatch.setenv("PYTHONPATH", f"{ROOT / 'client'}:{ROOT / 'server'}:/opt/site")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    env = bench.tree_env(tmp_path)
    assert env["PYTHONPATH"].split(":") == ["/opt/site"]
    assert "TRITON_CACHE_DIR" not in env
    # The harness puts the tree's folders ahead of everything else, its own included.
    server = ServerProcess([], env, inherit_env=False, roots=bench.tree_roots(tmp_path))
    assert server._env["PYTHONPATH"].split(":") == [str(tmp_path / "client"),
                                                    str(tmp_path / "server"), "/opt/site"]


@pytest.mark.slow
def test_a_cpu_comparison_runs_end_to_end(tmp_path: Path) -> None:
    base = tmp_path / "base"
    for part in ("client", "server"):
        shutil.copytree(ROOT / part, base / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    main = base / "server" / "warmgate" / "server" / "main.py"
    main.write_text(main.read_text().replace(
        "def main(argv: Sequence[str] | None = None) -> int:\n",
        "def main(argv: Sequence[str] | None = None) -> int:\n"
        f"    print({BASE_MARK!r}, file=sys.stderr, flush=True)\n"))
    assert BASE_MARK in main.read_text()
    proc = run_bench("bench/start.py ready-ab",
                     ["--base", str(base), "--cache-dir", str(tmp_path / "cache"),
                      "--rounds", "1", "--log-dir", str(tmp_path / "logs"), "--",
                      "--model", "tiny", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert len(result["runs"]["base"]) == len(result["runs"]["new"]) == 1
    assert result["new_over_base"] > 0
    base_log = (tmp_path / "logs" / "base-0.log").read_text()
    new_log = (tmp_path / "logs" / "new-0.log").read_text()
    assert "SUCCEEDED" in base_log and "SUCCEEDED" in new_log
    assert BASE_MARK in base_log and BASE_MARK not in new_log
