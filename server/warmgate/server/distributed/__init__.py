"""Tensor parallel: one model sharded Megatron-style over the GPUs (or CPU processes) of a host.

Rank 0 is the server process; it starts ranks 1..N-1 itself (worker.py), forms the process
group (NCCL on CUDA, gloo on the CPU) and sends each step's inputs to them over a pipe
(channel.py). Every rank runs the same forward on its shard (layout.py says which rows and
columns it holds; tensor_parallel.py does the collectives); only rank 0 samples.
Nothing here is imported at TP=1.
"""
