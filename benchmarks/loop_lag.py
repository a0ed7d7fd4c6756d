"""How responsive the caller's event loop stays while collectives run, per engine placement.

    python benchmarks/loop_lag.py [--procs 2] [--mib 64] [--repeats 3] [--out docs/bench]

Each rank runs a 1 ms timer beside the collectives and records how late it fires (the loop's lag), under:

* ``back-to-back``: 64 MiB all_reduces one after another for 2 s;
* ``periodic``: one 64 MiB all_reduce every 100 ms for 2 s (a training step's gradient sync beside a
  server's timers);
* ``busy-python``: the proxy-thread engine's case: one task loops ``await asyncio.sleep(0)`` (a busy
  application) while 1 MiB all_reduces run; the figure is the all_reduce's time, beside the same with an
  idle loop;
* ``overlap``: 100 ms of pure-Python compute on the main thread right after issuing a 64 MiB all_reduce
  (proxy-thread engine); the figure is the time until both are done (no overlap: compute + all_reduce).

Modes run in fresh processes under ``aioccl-run``, in rotating order per repeat; rank 0 prints the
slowest rank's p50 / p99 / max lag (ms) and the all_reduce's median time; the table gives medians over
repeats.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import _modes  # noqa: E402

MODES = ("back-to-back-inline", "back-to-back-thread", "periodic-inline", "periodic-thread", "busy-python-thread",
         "idle-thread", "overlap-thread")
RUN_S = 2.0


def rank_main(mode: str, mib: int) -> None:
    import asyncio
    import time

    import numpy as np

    import aioccl

    async def ticker(lags: list[float], stop: asyncio.Event) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    async def spinner(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0)

    def hold_meter() -> Any:
        """How long each callback of this loop runs (what holds the loop, apart from the OS): returns a
        function that stops measuring and gives the durations over 0.5 ms."""
        import asyncio.events as events

        run, held = events.Handle._run, []

        def timed(handle: Any) -> None:
            t0 = time.perf_counter()
            run(handle)
            d = time.perf_counter() - t0
            if d > 0.0005:
                held.append(d)

        events.Handle._run = timed  # type: ignore[method-assign,assignment]

        def stop() -> list[float]:
            events.Handle._run = run  # type: ignore[method-assign,assignment]
            return held

        return stop

    def compute(seconds: float) -> None:
        end, n = time.perf_counter() + seconds, 0
        while time.perf_counter() < end:
            n += sum(i * i for i in range(200))

    async def overlap(comm: aioccl.Communicator, x: np.ndarray) -> None:
        both, alone = [], []
        for _ in range(10):
            await comm.barrier()
            t0 = time.perf_counter()
            await comm.all_reduce(x)
            alone.append(time.perf_counter() - t0)
            await comm.barrier()
            t0 = time.perf_counter()
            w = comm.all_reduce(x)
            compute(0.1)
            await w
            both.append(time.perf_counter() - t0)
        mine = np.array([0.0, 0.0, 0.0, np.median(both) * 1e3, np.median(alone) * 1e3])
        await comm.all_reduce(mine, op="max")
        if comm.rank == 0:
            print("RESULT " + json.dumps({"lag_p50_ms": 0.0, "lag_p99_ms": 0.0, "lag_max_ms": 0.0, "op_ms": mine[3],
                                          "alone_ms": mine[4], "hold_max_ms": 0.0, "holds_over_1ms_per_op": 0.0,
                                          "ops": 10}))
        await comm.close()

    async def main() -> None:
        kind, engine = mode.rsplit("-", 1)
        comm = await aioccl.init(engine=engine)
        size = (mib << 20) // 4 if kind in ("back-to-back", "periodic", "overlap") else (1 << 20) // 4
        x = np.ones(size, np.float32)
        await comm.all_reduce(x)
        await comm.barrier()
        if kind == "overlap":
            await overlap(comm, x)
            return
        lags: list[float] = []
        times: list[float] = []
        holds = hold_meter()
        stop = asyncio.Event()
        side = asyncio.create_task(spinner(stop) if kind == "busy-python" else ticker(lags, stop))
        end = time.perf_counter() + RUN_S
        rounds = 0
        while True:
            flag = np.array([time.perf_counter() < end], np.int32)  # everyone stops at the same op
            await comm.all_reduce(flag, op="min")
            if not flag[0]:
                break
            t0 = time.perf_counter()
            await comm.all_reduce(x)
            times.append(time.perf_counter() - t0)
            rounds += 1
            if kind == "periodic":
                await asyncio.sleep(max(0.0, 0.1 - (time.perf_counter() - t0)))
        stop.set()
        held = holds()
        await side
        lag = np.array(lags or [0.0]) * 1e3
        mine = np.array([np.percentile(lag, 50), np.percentile(lag, 99), lag.max(), np.median(times) * 1e3,
                         max(held or [0.0]) * 1e3, sum(h > 0.001 for h in held) / max(rounds, 1)])
        await comm.all_reduce(mine, op="max")
        if comm.rank == 0:
            print("RESULT " + json.dumps({"lag_p50_ms": mine[0], "lag_p99_ms": mine[1], "lag_max_ms": mine[2],
                                          "op_ms": mine[3], "hold_max_ms": mine[4], "holds_over_1ms_per_op": mine[5],
                                          "ops": rounds}))
        await comm.close()

    asyncio.run(main())


def main() -> None:
    ap = _modes.parser(__doc__, MODES)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--modes", default=",".join(MODES), help="a comma-separated subset of " + ", ".join(MODES))
    a = ap.parse_args()
    if a.rank_mode:
        rank_main(a.rank_mode, a.mib)
        return
    modes = tuple(m for m in a.modes.split(",") if m in MODES)
    runs = _modes.rotate(modes, a.repeats, lambda m: _modes.launch(__file__, m, a.procs, ["--mib", str(a.mib)]))
    keys = ("lag_p50_ms", "lag_p99_ms", "lag_max_ms", "op_ms", "hold_max_ms", "holds_over_1ms_per_op")
    print(f"{a.procs} ranks on one host, float32 all_reduce ({a.mib} MiB; 1 MiB for busy/idle), median of "
          f"{a.repeats} runs of the slowest rank\n")
    print("| mode | loop lag p50 | p99 | max | all_reduce | longest callback | callbacks > 1 ms per op |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    import statistics
    summary = {}
    for m in modes:
        med = {k: statistics.median(r[k] for r in runs[m]) for k in keys}
        summary[m] = med
        lag = ("-", "-", "-") if m.startswith(("busy", "idle", "overlap")) else tuple(f"{med[k]:.2f} ms"
                                                                                  for k in keys[:3])
        extra = ""
        if m.startswith("overlap"):
            alone = statistics.median(r["alone_ms"] for r in runs[m])
            extra = f" (100 ms compute + all_reduce; all_reduce alone {alone:.2f} ms)"
        hold = ("-", "-") if m.startswith(("busy", "idle", "overlap")) else (
            f"{med['hold_max_ms']:.2f} ms", f"{med['holds_over_1ms_per_op']:.2f}")
        print(f"| {m} | {lag[0]} | {lag[1]} | {lag[2]} | {med['op_ms']:.2f} ms{extra} | {hold[0]} | {hold[1]} |")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        transport = "tcp" if os.environ.get("AIOCCL_SHM_DISABLE") == "1" else "shm"
        out = a.out / f"loop_lag_{transport}_{a.procs}.json"
        out.write_text(json.dumps({"runs": runs, "median": summary}, indent=1))


if __name__ == "__main__":
    main()
