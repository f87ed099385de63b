""".ci/tools-venv: the CI tools' venv sees the project's packages even when the project's
Python is itself a venv (a bare --system-site-packages venv sees only the base interpreter's,
so .ci/deploy-checks failed there with "No module named 'grpc'")."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tools_venv_imports_what_a_venv_python_imports(tmp_path: Path) -> None:
    project = tmp_path / "project-venv"
    venv.EnvBuilder(with_pip=False).create(project)
    python = project / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "only_in_the_project_venv.py").write_text("VALUE = 42\n")
    tools = tmp_path / "tools-venv"
    subprocess.run(["bash", str(ROOT / ".ci" / "tools-venv"), str(python), str(tools)],
                   check=True, capture_output=True, timeout=300)
    probe = subprocess.run([str(tools / "bin" / "python"), "-c",
                            "import only_in_the_project_venv as m; print(m.VALUE)"],
                           capture_output=True, text=True, check=False)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "42"
