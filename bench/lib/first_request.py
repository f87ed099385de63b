"""First-request diagnostics: is the first batch of each shape after ready, and the first
Generate, as fast as the steady ones, and if not, where does the extra time go?

    python bench/warm.py first-request --mode MODE [flags of the mode]

On a runner in this process (warmgate-server's runner flags, the CPU unless --device):

  batch    first batch / steady median per batch class, warmup on vs off, fresh processes
  probe    prefill / decode steps after idle gaps and other work: wall, CPU, GC pauses, new
           CUDA segments; --trace-segments: the allocations behind new segments (CUDA)
  touch    first GEMM at a new token count, first batch vs again under torch.profiler, and
           after the warmup's GEMM sweep (GPU)
  profile  cProfile of each batch class's first step against its steady steps, and GPU busy
           time per step

On Generate over gRPC (time to first token):
  ttft       first request's TTFT after ready / steady median on fresh server processes,
             warmup on vs off; throughput at many streams without and with speculation
  breakdown  the first request's TTFT split into the serving loop's parts (one process)
  options    on one server, the first request that uses each sampling option (logprobs,
             penalties, min_p, min_tokens, logit_bias, JSON schema / regex / EBNF) after
             ready / steady median, with the server's compiles and graph misses per option
  configs    random server configurations (k, max_num_seqs, token budget, model length,
             block size, prompt length), a fresh server each: the first request's TTFT and
             decode step after ready / steady, worst first

`python bench/warm.py first-request --mode MODE --help` lists a mode's flags.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

# mode -> (module beside this file, its entry function)
MODES = {"batch": ("first_request_batch", "main"), "probe": ("first_request_probe", "probe"),
         "touch": ("first_request_probe", "touch"),
         "profile": ("first_request_profile", "main"), "ttft": ("first_request_ttft", "main"),
         "breakdown": ("first_request_breakdown", "main"),
         "options": ("first_request_options", "main"),
         "configs": ("first_request_configs", "main")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     add_help=False)
    parser.add_argument("--mode", choices=MODES, required=True)
    if not any(a == "--mode" or a.startswith("--mode=") for a in argv):
        parser.add_argument("-h", "--help", action="help")
    args, rest = parser.parse_known_args(argv)
    module, function = MODES[args.mode]
    run: Callable[..., int] = getattr(importlib.import_module(module), function)
    return run(rest, prog=f"{parser.prog} --mode {args.mode}")


if __name__ == "__main__":
    sys.exit(main())
