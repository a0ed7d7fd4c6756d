"""Run by tests/test_native.py under AddressSanitizer (LD_PRELOAD) with the module built with
-fsanitize=address,undefined: the CPython glue (Program, Channel, Lane) through real collectives."""

import asyncio
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("aioccl.native._core", sys.argv[1])
assert spec is not None and spec.loader is not None
core = importlib.util.module_from_spec(spec)
sys.modules["aioccl.native._core"] = core
spec.loader.exec_module(core)

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import aioccl  # noqa: E402
from aioccl import native  # noqa: E402

sys.path.insert(0, "tests")
from test_native import _every_collective  # noqa: E402

from conftest import close_all, make_comms  # noqa: E402


async def main() -> None:
    assert native.core is core, native.status()
    for n in (1, 2, 3):
        comms = await make_comms(n)
        for dt in (np.dtype(np.int8), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float64)):
            for _ in range(3):  # the second and third calls take the fast lane
                xs = [np.full(7, c.rank + 1, dt) for c in comms]
                await asyncio.gather(*(c.all_reduce(x, op) for c, x in zip(comms, xs, strict=True)
                                       for op in ("sum",)))
                assert all((x == n * (n + 1) // 2).all() for x in xs), xs
            if n > 1:
                await _every_collective(comms, dt)
        if n == 2:  # a mismatch through the lane
            got = await asyncio.gather(*(c.all_reduce(np.ones(7 + c.rank, np.float64)) for c in comms),
                                       return_exceptions=True)
            assert all(isinstance(e, aioccl.CollectiveMismatch) for e in got), got
        await close_all(comms)
    print("sanitized module ok", flush=True)


asyncio.run(main())
