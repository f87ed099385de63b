"""Compile every kernel the PDL launch sites (tests/pdl_sites.py) launch with the switch on, as
those sites launch them, for sm_90 without a GPU, and read each binary's PTX: it must be built
with launch_pdl, execute griddepcontrol.wait, and before that wait touch global memory only to
load the kernel's weight arguments (tests/pdl_sites.WEIGHT_ARGS), never to store. Prints one
JSON line per compiled kernel: {"kernel", "launch_pdl", "wait", "release", "problems"}.

A program, run by tests/test_pdl_ptx.py in a process without TRITON_INTERPRET (the kernels
must be defined for the GPU); tests/sm90_compile.py compiles them without a CUDA driver.
"""

from __future__ import annotations

import json
import os
import re
import sys

from tests.pdl_sites import SITES, WEIGHT_ARGS
from tests.sm90_compile import compile_for_hopper, record_launches
from warmgate.server.kernels import pdl

_INSTRUCTION = re.compile(r"^(?:@!?%\w+\s+)?([a-z][\w.:]*)\s*(.*?);?$")
_REGISTER = re.compile(r"%[A-Za-z_][\w.]*")


def ptx_problems(ptx: str, kernel: str, params: list[str], weights: tuple[str, ...]
                 ) -> list[str]:
    """What the PTX does before its first griddepcontrol.wait that PDL forbids: a store, or a
    global load whose address derives from an argument other than `weights` (a dataflow pass
    over the straight-line prologue: each register carries the arguments it came from)."""
    lines = [line.split("//")[0].strip() for line in ptx.splitlines()]
    waits = [i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait")]
    if not waits:
        return ["no griddepcontrol.wait"]
    param_names = {f"{kernel}_param_{i}": name for i, name in enumerate(params)}
    origin: dict[str, set[str]] = {}
    problems = []
    for line in lines[:waits[0]]:
        match = _INSTRUCTION.match(line)
        if match is None or line.startswith((".", "{", "}", "$")):
            continue
        op, operands = match.groups()
        regs = _REGISTER.findall(operands)
        from_params = {param_names.get(p, p) for p in re.findall(r"\[\s*(\w+_param_\d+)",
                                                                 operands)}
        if op.startswith(("st.global", "atom.", "red.")):
            problems.append(f"before the wait: {line}")
            continue
        if op.startswith("ld.") and ".global" in op:
            address = re.search(r"\[(.*?)\]", operands)
            sources = set().union(*(origin.get(r, set()) for r in
                                    _REGISTER.findall(address.group(1) if address else "")))
            if not sources or not sources <= set(weights):
                problems.append(f"before the wait, a load from {sorted(sources)}: {line}")
            for reg in regs:
                origin[reg] = sources
            continue
        if not regs:
            continue
        dst, srcs = regs[0], regs[1:]
        origin[dst] = set(from_params).union(*(origin.get(r, set()) for r in srcs))
    return problems


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("run without TRITON_INTERPRET: the kernels must be defined for the GPU",
              file=sys.stderr)
        return 2
    pdl.set_pdl(True)
    pdl.runs_compiled = lambda t: True  # type: ignore[assignment]  # as CUDA tensors would

    def every_site() -> None:
        for site in SITES.values():
            site()

    for fn, spec in record_launches(every_site):
        name = fn.fn.__name__
        compiled = compile_for_hopper(fn, spec, ("num_warps", "num_stages", "launch_pdl"))
        ptx = compiled.asm["ptx"]
        params = [arg for arg, ty in spec["signature"].items() if ty != "constexpr"]
        print(json.dumps({
            "kernel": name, "launch_pdl": bool(compiled.metadata.launch_pdl),
            "wait": "griddepcontrol.wait" in ptx,
            "release": "griddepcontrol.launch_dependents" in ptx,
            "problems": ptx_problems(ptx, name, params, WEIGHT_ARGS.get(name, ()))}),
            flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
