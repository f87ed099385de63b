"""The `warmgate-server` command: the server's dependencies looked for before anything imports
them, then warmgate.server.main.

The base install is the thin client (grpcio and protobuf); torch and the rest come with the
`[server]` extra. Without it the command would die in a traceback about torch at its first
import; it says instead, in one line, what to install, and exits 2 as a start-up error does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys

EXIT_USAGE = 2
# Top-level modules of the [server] extra's packages that start-up imports (pyproject.toml).
SERVER_MODULES = ("torch", "numpy", "safetensors", "prometheus_client", "grpc_reflection")


def missing_dependency() -> str | None:
    """The first server module that cannot be found, or None."""
    return next((m for m in SERVER_MODULES if importlib.util.find_spec(m) is None), None)


def install_hint() -> str:
    try:
        version = importlib.metadata.version("warmgate")
    except importlib.metadata.PackageNotFoundError:
        version = "VERSION"
    return (f"pip install 'warmgate-{version}-py3-none-any.whl[server]' (the wheel "
            "`python -m build` makes), or in a checkout pip install -e '.[server]'")


def main() -> int:
    missing = missing_dependency()
    if missing is not None:
        print(f"warmgate-server: the server's dependencies are not installed (no module named "
              f"{missing!r}); install warmgate with its [server] extra: {install_hint()}",
              file=sys.stderr)
        return EXIT_USAGE
    from warmgate.server.main import main as server_main

    return server_main()


if __name__ == "__main__":
    sys.exit(main())
