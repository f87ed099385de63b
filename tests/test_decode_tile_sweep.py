"""`bench/serve.py kernels`' tile and split tables (bench/lib/decode_splits_gpu.py) time the
server's own launch first: the tile the server runs is read from decode_attention, so a
change of the server's tile cannot leave the sweep's first column naming another one."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.bench_harness import load_script
from warmgate.server.kernels import decode_attention

sweep = load_script("bench/lib/decode_splits_gpu.py")


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_tile_sweep_times_the_servers_tile_first_and_each_once(head_dim: int) -> None:
    configs = sweep.tile_configs(head_dim)
    assert configs[0] == decode_attention._decode_config(head_dim, torch.bfloat16, True)
    assert len(set(configs)) == len(configs)
    assert set(sweep.TILE_CONFIGS) <= set(configs)
