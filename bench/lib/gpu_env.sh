# Sourced by bench/gpu_*.sh from the repository root, with $OUT made: on a GPU machine without
# network the wheels in .whl/ (flashinfer, the grpc set, ...: docs/pending-gpu-runs.md) go into
# /tmp/site, and both they and this checkout's client/ and server/ go on PYTHONPATH.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/client:$PWD/server${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The card this machine has names the result files (h100-*, h200-*, cpu-* on a dry run), so
# a figure never travels under another card's name.
CARD=$(python3 -m warmgate.server.devtools.gpu_card --slug) || CARD=unknown-card
