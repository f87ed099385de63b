"""Programmatic dependent launch in the binaries, without a GPU: every kernel the PDL launch
sites launch with the switch on, compiled for sm_90 as those sites launch it (tests/
pdl_ptx_probe.py), is built with launch_pdl, executes griddepcontrol.wait and
griddepcontrol.launch_dependents, and before the wait stores nothing and loads only its
weights (the GEMV's first weight tile, the RMSNorm weight): a kernel launched early that read
a previous kernel's output, or overwrote its input, before the wait would race."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.pdl_sites import CONVERTED
from tests.probe_run import run_probe


def test_every_pdl_kernel_waits_before_touching_what_another_kernel_wrote() -> None:
    reports = run_probe("tests.pdl_ptx_probe", timeout_s=240)
    assert {r["kernel"] for r in reports} == {name for _, name in CONVERTED}
    for r in reports:
        assert r["launch_pdl"] and r["wait"] and r["release"] and not r["problems"], r
