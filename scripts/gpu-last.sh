#!/usr/bin/env bash
# torch CUDA tensors through backend="aioccl" against Gloo, and jax_ext's parity run, on the device path.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
run() { echo "== $*"; timeout 100 "$@" 2>&1 | grep -E "OK|FAIL|failures [^0]|Error|exited|c10d n=|\.py\", line" | head -24 || echo "!! failed"; }
run $PY -m torch.distributed.run --nproc-per-node 2 tests/workers/torch_c10d.py cuda
JAX_PLATFORMS=cuda JAXPAR_LOG=/tmp/jaxpar.log run $PY -m aioccl.run --nproc-per-node 2 tests/workers/jax_parity.py
