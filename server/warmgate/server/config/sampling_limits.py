"""Limits on a request's sampling options that the API validates and the runner sizes for.

Torch-free so the gRPC layer can validate a request without importing the runner."""

# Largest top-n a request may ask for, per generated or prompt token (vLLM's default cap); the
# warmup runs the logprobs gather at this width so no request compiles a wider one.
MAX_LOGPROBS = 20
