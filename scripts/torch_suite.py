"""torch's own distributed conformance suite (``distributed_test._DistTestBase``) on a backend, ranks forked.

torch ships the suite in its wheel; its driver (``test/distributed/test_distributed_spawn.py``) does not
ship. This is that driver: every test of the suite at ``--world-size`` ranks, each rank a process forked
from this one (torch's CI may fork too; it is 10x faster than spawning), one line per test, and a JSON of
the outcomes. ``--gates gloo``: the suite's own gates (``BACKEND == "gloo"``) treat aioccl as Gloo, and
its groups asked for Gloo are aioccl's: what a Gloo user who switches would meet.

    python scripts/torch_suite.py --backend aioccl --world-size 3 --gates gloo --out aioccl-3.json
    python scripts/torch_suite.py --compare gloo-3.json aioccl-3.json   # what passes on one but not the other
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def configure(backend: str, world_size: int, gates: str, timeout_s: int) -> None:
    """The environment the suite reads at import (its BACKEND gates, its world size, its temp dir)."""
    os.environ["BACKEND"] = "gloo" if gates == "gloo" else backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="torch-suite-")
    os.environ.setdefault("AIOCCL_TIMEOUT", str(timeout_s))  # a hung test is named in this time, not 5 min
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    os.environ["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"
    sys.path.insert(0, str(ROOT))
    import torch.distributed as dist

    import aioccl.interop.c10d

    aioccl.interop.c10d.register()
    if backend == "aioccl" and gates == "gloo":
        _redirect_gloo(dist)


# Tests that pass on Gloo and cannot on any other backend, with why (docs/torch.md lists them too)
GLOO_ONLY = {
    "test_get_backend": "asserts dist.get_backend() == BACKEND, which the gloo gates set to 'gloo'",
    "test_monitored_barrier_gloo": "dist.monitored_barrier: torch refuses every backend but Gloo ('monitored_barrier "
                                   "is only implemented for GLOO backend'); a group's own monitored_barrier works",
    "test_monitored_barrier_gloo_subgroup": "dist.monitored_barrier on a subgroup: refused by torch as above",
}


def _redirect_gloo(dist: Any) -> None:
    """Groups the suite asks Gloo for become aioccl's (the default group and ``new_group(backend="gloo")``),
    and a Gloo group made any other way raises: a test that passes has run on aioccl, with no Gloo fallback."""
    c10d = dist.distributed_c10d

    class NoGloo(c10d.ProcessGroupGloo):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any, **kw: Any) -> None:
            raise RuntimeError("torch-suite: a Gloo process group was made under --gates gloo (a Gloo fallback)")

    c10d.ProcessGroupGloo = NoGloo

    def swap(backend: Any) -> Any:
        return "aioccl" if isinstance(backend, str) and backend.lower() == "gloo" else backend

    init, new_group = c10d.init_process_group, c10d.new_group

    def init_process_group(*args: Any, backend: Any = None, **kw: Any) -> Any:
        return init(*args, backend=swap(backend), **kw)

    def new_group_(*args: Any, backend: Any = None, **kw: Any) -> Any:
        return new_group(*args, backend=swap(backend), **kw)

    for mod in (dist, c10d):
        mod.init_process_group, mod.new_group = init_process_group, new_group_


class Outcomes(unittest.TextTestResult):
    """Each test's outcome: passed, failed (with the first lines of why) or skipped (with the reason)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.outcomes: dict[str, dict[str, Any]] = {}
        self._t0 = 0.0

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802  (unittest's name)
        self._t0 = time.monotonic()
        super().startTest(test)

    def _note(self, test: unittest.TestCase, outcome: str, why: str = "") -> None:
        self.outcomes[test._testMethodName] = {"outcome": outcome, "why": why[-600:],
                                               "seconds": round(time.monotonic() - self._t0, 2)}

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addSuccess(test)
        self._note(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._note(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._note(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._note(test, "skipped", reason)


def _faster_polls() -> None:
    """The suite's harness polls every 0.1 s: for its ranks to exit, and in its file barrier (``_barrier()``,
    a few per test). Polling every 5 ms changes no test and saves a good part of the suite's time. The barrier
    is torch's own (``distributed_test.Barrier.sync``), but for the interval."""
    import time
    import types

    from torch.testing._internal import common_distributed
    from torch.testing._internal.distributed import distributed_test as dt

    quick = {k: getattr(time, k) for k in dir(time) if not k.startswith("__")}
    quick["sleep"] = lambda s: time.sleep(min(s, 0.005))
    common_distributed.time = types.SimpleNamespace(**quick)  # type: ignore[attr-defined]

    def sync(cls: Any, wait_for: int | None = None, timeout: float = 10) -> None:
        wait_for = dt.dist.get_world_size() if wait_for is None else wait_for
        cls.barrier_id += 1
        barrier_dir = os.path.join(os.environ["TEMP_DIR"], "barrier")
        with dt._lock(), open(os.path.join(barrier_dir, str(os.getpid())), "w") as f:
            f.write(str(cls.barrier_id))
        start = time.time()
        while True:
            with dt._lock():
                arrived = 0
                for name in os.listdir(barrier_dir):
                    with open(os.path.join(barrier_dir, name)) as g:
                        arrived += int(g.read()) >= cls.barrier_id
            if arrived == wait_for:
                return
            if time.time() - start > timeout:
                raise RuntimeError("barrier timeout")
            time.sleep(0.005)

    dt.Barrier.sync = classmethod(sync)  # type: ignore[assignment]


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.unlink(path)


def run(names: list[str] | None, verbosity: int, exact: bool = False) -> dict[str, dict[str, Any]]:
    from torch.testing._internal import common_distributed
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    _faster_polls()

    class TorchSuite(TestDistBackend, DistributedTest._DistTestBase):  # type: ignore[misc,name-defined]
        def setUp(self) -> None:
            # torch's setUp makes the test's temporary folder, and its tearDown removes it; a test that skips in
            # setUp never gets a tearDown, so its folder is removed here (a cleanup runs whatever setUp did)
            self.addCleanup(common_distributed.cleanup_temp_dir)
            super().setUp()
            self.addCleanup(_remove, self.file_name)  # the store's file (or a folder by its name) torch leaves
            import torch.multiprocessing as mp

            self._start_processes(mp.get_context("fork").Process)  # torch 2.13 has no _fork_processes left

    loader = unittest.TestLoader()
    every = loader.getTestCaseNames(TorchSuite)
    chosen = [n for n in every if names is None or n in names
              or (not exact and any(n.startswith(want + "_") for want in names))]
    suite = unittest.TestSuite(TorchSuite(n) for n in chosen)
    runner = unittest.TextTestRunner(resultclass=Outcomes, verbosity=verbosity, stream=sys.stdout)
    result = runner.run(suite)
    assert isinstance(result, Outcomes)
    return result.outcomes


def compare(base_file: str, other_file: str) -> list[str]:
    """The tests that pass in ``base_file`` and do not in ``other_file``, with why."""
    base, other = json.loads(Path(base_file).read_text()), json.loads(Path(other_file).read_text())
    lost = []
    for name, o in sorted(base["tests"].items()):
        theirs = other["tests"].get(name, {"outcome": "absent", "why": ""})
        if o["outcome"] == "passed" and theirs["outcome"] != "passed":
            why = [line for line in theirs["why"].strip().splitlines() if line.strip()]
            lost.append(f"{name}: {theirs['outcome']}: {why[-1].strip() if why else ''}")
    return lost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["gloo", "aioccl"], default="aioccl")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--gates", choices=["as-written", "gloo"], default="as-written",
                    help="gloo: the suite's Gloo-only gates let aioccl in (and its Gloo groups are aioccl's)")
    ap.add_argument("--tests", nargs="*", help="test names (or prefixes ending before an _) to run; default all")
    ap.add_argument("--passed-in", metavar="JSON", help="run only the tests that passed in this earlier run")
    ap.add_argument("--timeout", type=int, default=60, help="AIOCCL_TIMEOUT for the ranks (seconds)")
    ap.add_argument("--out", help="write the outcomes here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BASE", "OTHER"), help="list what passes in BASE, not in OTHER")
    ap.add_argument("-v", "--verbose", action="count", default=1)
    args = ap.parse_args()
    if args.compare:
        for line in compare(*args.compare):
            print(line)
        return
    configure(args.backend, args.world_size, args.gates, args.timeout)
    first = os.environ["TEMP_DIR"]  # (each test of torch's makes its own and points TEMP_DIR at it)
    try:
        _main(args)
    finally:
        shutil.rmtree(first, ignore_errors=True)


def _main(args: argparse.Namespace) -> None:
    import torch

    t0 = time.monotonic()
    names, exact = args.tests, False
    if args.passed_in:
        earlier = json.loads(Path(args.passed_in).read_text())["tests"]
        names = [k for k, o in earlier.items() if o["outcome"] == "passed"]
        exact = True
    outcomes = run(names, args.verbose, exact)
    counts = {k: sum(o["outcome"] == k for o in outcomes.values()) for k in ("passed", "failed", "skipped")}
    summary = {"backend": args.backend, "world_size": args.world_size, "gates": args.gates,
               "torch": torch.__version__, "seconds": round(time.monotonic() - t0, 1), **counts, "tests": outcomes}
    print(f"torch-suite {args.backend} world {args.world_size} gates {args.gates} torch {torch.__version__}: "
          f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped of {len(outcomes)} "
          f"in {summary['seconds']} s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
