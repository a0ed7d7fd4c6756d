#!/usr/bin/env bash
# Everything aioccl's ib transport promises, on a machine with an RDMA NIC (InfiniBand or RoCE).
#
#   scripts/rdma-check.sh [NPROC]     # one host: NPROC ranks, every pair over queue pairs of the
#                                     # local port (AIOCCL_NET=ib; traffic loops through the NIC)
#
# Two hosts: run the same aioccl-run command on each with --nnodes 2 --node-rank {0,1}
# --master-addr HOST0 (see docs/transports.md); pairs across hosts choose ib by themselves.
#
# 1. what the NIC offers (ibv_devinfo where installed) and aioccl's verdict (aioccl-info);
# 2. the protocol and loopback-backend tests, then the real-port tests (pytest -m rdma);
# 3. every op x every dtype across NPROC processes over ib (tests/workers/collectives.py);
# 4. aioccl-perf all_reduce and sendrecv, 8 B .. 64 MiB, over ib and over TCP on the same ranks,
#    JSON in $OUT (or ./rdma-check-out).
# Exits non-zero on the first failure; exits 3 at step 1 when no port is usable, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC="${1:-2}"
PY="${PYTHON:-python3}"
OUTDIR="${OUT:-rdma-check-out}"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset AIOCCL_IB_BACKEND

echo "== 1. the NIC and aioccl's verdict"
command -v ibv_devinfo >/dev/null && ibv_devinfo | tee "$OUTDIR/ibv_devinfo.txt" || echo "(ibv_devinfo not installed)"
"$PY" -m aioccl.tools.info | tee "$OUTDIR/info.txt"
"$PY" -c "from aioccl.transport.ib.detect import detect; import sys; v = detect(); print(v.reason);
sys.exit(0 if v.usable and v.backend == 'pyverbs' else 3)"

echo "== 2. tests: protocol, loopback backend, real port"
"$PY" -m pytest -q -p no:cacheprovider tests/test_ib_protocol.py tests/test_ib_loopback.py tests/test_ib_verbs.py
"$PY" -m pytest -q -p no:cacheprovider -m rdma -rs tests/test_ib_verbs.py | tee "$OUTDIR/rdma_tests.txt"
grep -q "skipped" "$OUTDIR/rdma_tests.txt" && { echo "rdma tests skipped: see above"; exit 1; }

echo "== 3. every op x dtype, $NPROC processes over ib"
AIOCCL_NET=ib AIOCCL_SHM_DISABLE=1 EXPECT_TRANSPORT=ib "$PY" -m aioccl.run --nproc-per-node "$NPROC" \
  tests/workers/collectives.py | tee "$OUTDIR/collectives_ib.txt" | grep -E "FAIL|failures"

echo "== 4. aioccl-perf over ib, then TCP"
for net in ib socket; do
  for op in all_reduce sendrecv; do
    AIOCCL_NET=$net AIOCCL_SHM_DISABLE=1 "$PY" -m aioccl.tools.perf "$op" --np "$NPROC" -b 8 -e 64M -f 4 \
      -n 20 -w 5 --json "$OUTDIR/perf_${op}_$net.json" --no-progress
  done
done
echo "rdma-check: all steps passed; results in $OUTDIR"
