"""`bench/serve.py kernels`' tile and split tables (bench/lib/decode_splits_gpu.py) time the
server's own launches first: the tiles the server runs are read from decode_attention, so a
change of the server's tile cannot leave the sweep's first columns naming others, and each row
marks the one its grid takes."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.bench_harness import load_script
from warmgate.server.kernels import decode_attention

sweep = load_script("bench/lib/decode_splits_gpu.py")


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_tile_sweep_times_the_servers_tiles_first_and_each_once(head_dim: int) -> None:
    configs = sweep.tile_configs(head_dim)
    servers = [decode_attention._decode_config(head_dim, torch.bfloat16, True,
                                               batch * sweep.NUM_KV_HEADS)
               for batch in sweep.TILE_BATCHES]
    assert configs[:len(set(servers))] == list(dict.fromkeys(servers))
    assert configs[0] == servers[0]
    assert len(set(configs)) == len(configs)
    assert set(sweep.TILE_CONFIGS) <= set(configs)


def test_each_row_marks_the_tile_the_server_runs_at_its_grid() -> None:
    """The tile follows the grid: at head size 64 a batch of 128 by 8 KV heads takes another
    tile than 64 does, so the row, not the column, says which is the server's."""
    assert sweep.server_tile(64, 64) == (64, 4, 2)
    assert sweep.server_tile(64, 128) == (32, 2, 4)
    assert sweep.server_tile(128, 128) == (64, 4, 2)
    assert sweep.tile_configs(64)[:2] == [(64, 4, 2), (32, 2, 4)]
