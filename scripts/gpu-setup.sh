# Sourced by the GPU scripts (gpu-frameworks.sh, gpu-small.sh) after `cd` to the repository root, with
# OUTDIR set: the interpreter (PY), the output folder, the native core built if it is not (a fresh GPU
# machine), and MPS started if it is not running (stopped again at exit): the ranks share one GPU.
PY="${PYTHON:-python3}"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several processes share one GPU
"$PY" -c "import aioccl.native as n; assert n.core is not None" 2>/dev/null ||
  "$PY" -m pip install --quiet --no-build-isolation --no-deps -e .
MPS_STARTED=0
if command -v nvidia-cuda-mps-control >/dev/null && ! pgrep -x nvidia-cuda-mps >/dev/null; then
  nvidia-cuda-mps-control -d && MPS_STARTED=1
fi
trap '[ "$MPS_STARTED" = 1 ] && echo quit | nvidia-cuda-mps-control' EXIT
