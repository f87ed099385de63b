"""The serving path: requests in, tokens out, over the runner warmup made hot.

`scheduler` decides each step (continuous batching over the paged KV cache), `ngram` drafts
speculative tokens, `loop` runs steps on the runner's worker thread, and
`warmgate.server.api.generation` is the gRPC side that feeds it.
"""
