"""What a process pays before its first op: ``import aioccl`` and a communicator load neither ml_dtypes nor the
GPU path (ml_dtypes 0.7 takes half a second of CPU to import; the GPU path's kernels import it), and bfloat16
still works everywhere once the app brings ml_dtypes, however late; the launcher loads none of the
communicator."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

# two ranks in one process over shared memory, so the native lane (where the core has it) carries the ops
SCRIPT = r"""
import asyncio, os, sys
import numpy as np
import aioccl

HEAVY = ("ml_dtypes", "aioccl.kernels.gpu", "aioccl.gpu.runner")

async def main():
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    comms = await asyncio.gather(*(aioccl.Communicator.create(uid, r, 2, timeout=20) for r in range(2)))
    xs = [np.full(8, r + 1, np.float32) for r in range(2)]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    assert all((x == 3).all() for x in xs), xs
    print("loaded before bfloat16:", [m for m in HEAVY if m in sys.modules])

    import ml_dtypes  # the app brings it after the communicators were made
    bf = ml_dtypes.bfloat16
    for shape in (8, 1 << 16):  # a small op and a large one
        xs = [np.full(shape, -1, bf) for _ in range(2)]
        for r, x in enumerate(xs):
            x[:] = (np.arange(shape) % 5 + r).astype(bf)
        await asyncio.gather(*(c.all_reduce(x, op="max") for c, x in zip(comms, xs)))
        want = (np.arange(shape) % 5 + 1).astype(bf)
        assert all((x == want).all() for x in xs), shape
        outs = await asyncio.gather(*(c.all_gather(x) for c, x in zip(comms, xs)))
        assert all(o.dtype == bf and (o == np.concatenate([want, want])).all() for o in outs), shape
    sent = np.arange(16).astype(bf)
    got = np.full(16, -1, bf)
    await asyncio.gather(comms[0].send(sent, 1), comms[1].recv(got, 0))
    assert (got == sent).all()
    assert bf in aioccl.SUPPORTED_DTYPES
    await asyncio.gather(*(c.close() for c in comms))
    print("bfloat16 exact")

asyncio.run(main())
"""


def _run(env: dict[str, str]) -> str:
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(ROOT), **env})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout


def test_a_communicator_loads_neither_ml_dtypes_nor_the_gpu_path_and_late_bfloat16_is_exact():
    out = _run({})
    assert "loaded before bfloat16: []" in out and "bfloat16 exact" in out, out


def test_late_bfloat16_is_exact_without_the_native_core_too():
    out = _run({"AIOCCL_NATIVE": "0"})
    assert "loaded before bfloat16: []" in out and "bfloat16 exact" in out, out


def test_the_launcher_loads_none_of_the_communicator():
    """``aioccl-run`` is ``python -m aioccl.run``, which imports the package first: the package's public names
    are loaded on first use, so a launch costs a fresh Python and the launcher's own few modules."""
    code = ("import sys, aioccl.run\n"
            "print(sorted(m for m in ('numpy', 'aioccl.communicator', 'aioccl.engine') if m in sys.modules))\n"
            "import aioccl\n"
            "print(aioccl.Communicator.__name__, aioccl.ReduceOp.SUM.value, len(aioccl.SUPPORTED_DTYPES))\n"
            "print(aioccl.native.__name__, aioccl.gpu.__name__, hasattr(aioccl, 'no_such_name'))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == ["[]", "Communicator sum 10", "aioccl.native aioccl.gpu False"], p.stdout
