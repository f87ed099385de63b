"""`warmgate report --plot out.png`: draw a warmup report as a phase timeline.

The report comes from `--input FILE` (JSON from `warmgate --json warmup`, `warmgate --json
status` or `python -m warmgate.server.run_warmup --json`; `-` reads stdin) or, without it, from the
server's last finished warmup (GetStatus: nothing is run). Exit codes follow the CLI's: 0 the
plot was written, 4 there is no report to draw (none finished yet, unreadable input, or
matplotlib missing), 3 the server answered with an error (raised to the CLI's handler).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from warmgate.v1 import warmup_pb2 as pb

# EXIT_NO_REPORT is the CLI's EXIT_LOCAL (exit_codes.py): nothing was drawn, no warmup implied.
EXIT_OK, EXIT_NO_REPORT = 0, 4
STATUS_TIMEOUT_S = 10.0


class _StatusClient(Protocol):
    def get_status(self, *, timeout: float | None = None) -> pb.WarmupStatus: ...


def add_report_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register `report` on the CLI's subparsers (argparse's add_subparsers() result)."""
    report = subparsers.add_parser(
        "report", help="draw a warmup report as a phase timeline (needs the [plot] extra)",
        description="Draw the phases of a warmup report end to end, coloured by status, with "
                    "their seconds and skip reasons. Without --input, the server's last "
                    "finished warmup is drawn (nothing is run).")
    report.add_argument("--input", metavar="FILE", default=None,
                        help="report JSON to draw instead of asking the server ('-': stdin)")
    report.add_argument("--plot", metavar="PNG", required=True, help="where to write the PNG")
    return report


def _load(path: str) -> dict[str, Any]:
    if path == "-":
        return json.load(sys.stdin)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _live_report(client: _StatusClient, timeout: float | None) -> dict[str, Any] | None:
    from warmgate.client.render import to_dict

    status = client.get_status(timeout=timeout or STATUS_TIMEOUT_S)
    return to_dict(status.last_report) if status.HasField("last_report") else None


def run_report(args: argparse.Namespace, client_factory: Callable[[], _StatusClient], *,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Handle `warmgate report`; `client_factory` is called only when no --input is given."""
    from warmgate.client.report_plot import (
        PlotDependencyError,
        ReportError,
        plot_report,
        timeline,
        total_seconds,
    )

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    source = args.input
    try:
        if source is not None:
            report = _load(source)
        else:
            source = getattr(args, "target", "the server")
            report = _live_report(client_factory(), getattr(args, "rpc_timeout", None))
            if report is None:
                print(f"warmgate: {source}: no warmup has finished yet; run `warmgate wait` "
                      "or `warmgate warmup` first", file=err)
                return EXIT_NO_REPORT
        plot_report(report, args.plot)
        phases = timeline(report)
    except (OSError, ReportError, json.JSONDecodeError, PlotDependencyError) as exc:
        print(f"warmgate report: {source}: {exc}", file=err)
        return EXIT_NO_REPORT
    total = total_seconds(report)
    if getattr(args, "json", False):
        print(json.dumps({"plot": args.plot, "phases": len(phases), "total_s": total}),
              file=out)
    else:
        print(f"wrote {args.plot}: {len(phases)} phases, {total:.3f} s", file=out)
    return EXIT_OK
