"""Does the late stand-in catch each stream mistake? Break the GPU runner one way at a time and run the GPU
worker under tests/fakecupy: every mutation must fail it, and the unbroken runner must pass.

    python scripts/standin_mutations.py [--ranks 3]

Each mutation is applied to a copy of the package in a temporary directory (the checkout is never touched).
Prints one line per mutation: its name, the failed checks per rank (-1: a rank crashed before its checks were
counted, which also fails the run), and CAUGHT or MISSED; exits 1 if any was missed. Takes about a minute on
two cores; not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = "aioccl/gpu/runner.py"
# name -> (text in runner.py, replacement)
MUTATIONS = {
    "host reads staged input before its D2H event": ("                await wait_event(events[k])",
                                                     "                pass"),
    "peers read scratch before the publish copy ran": ("            await wait_event(launch(functools.partial("
                                                       "plans.publish",
                                                       "            (launch(functools.partial(plans.publish"),
    "scratch rewritten while the consume kernels still read it": (
        "            await wait_event(ev)\n            await side.barrier", "            await side.barrier"),
    "no barrier after consuming the peers' scratch": (
        "            await wait_event(ev)\n            await side.barrier(timeout=self._remaining(deadline))",
        "            await wait_event(ev)"),
    "pinned block reused while its copy is queued": ("            self._pinned.give_back(block, ev)",
                                                     "            self._pinned.give_back(block, None)"),
    "input copied on a stream other than the caller's": (
        "(b - a) * isz, D2H, g.stream.ptr)", "(b - a) * isz, D2H, self._cp.cuda.Stream(non_blocking=True).ptr)"),
    "Work completed before its results landed": ("        await wait_event(ev)\n\n    def _record",
                                                 "        pass\n\n    def _record"),
}


def run(pkg_root: Path, ipc: str, ranks: int) -> list[int]:
    env = {**os.environ, "PYTHONPATH": f"{pkg_root}{os.pathsep}{ROOT / 'tests' / 'fakecupy'}",
           "AIOCCL_GPU_IPC": ipc, "AIOCCL_GPU_SCRATCH": "4096", "AIOCCL_GPU_STAGE_PIECE": "4096",
           "FAKECUPY_DELAY_MS": "1", "GPU_OPS_STREAM": "1"}
    p = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(ranks),
                        str(ROOT / "tests" / "workers" / "gpu_ops.py"), "1", "1500"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=pkg_root)
    out = p.stdout + p.stderr
    failed = [int(m) for m in re.findall(r"GPU ops: \d+ checks, (\d+) failures", out)]
    if p.returncode != 0 and not any(failed):
        failed = [-1]  # crashed or hung rather than checked: still not a pass
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=3)
    ns = ap.parse_args()
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp)
        shutil.copytree(ROOT / "aioccl", pkg / "aioccl", ignore=shutil.ignore_patterns("__pycache__"))
        original = (ROOT / RUNNER).read_text()
        for name, (old, new) in [("(none: the runner as it is)", ("", ""))] + list(MUTATIONS.items()):
            if old and old not in original:
                print(f"{name}: its text is no longer in {RUNNER}; update this script", flush=True)
                missed += 1
                continue
            (pkg / RUNNER).write_text(original.replace(old, new, 1) if old else original)
            results = {ipc: run(pkg, ipc, ns.ranks) for ipc in ("1", "0")}
            failed = any(any(v) for v in results.values())
            ok = failed if old else not failed
            missed += not ok
            verdict = ("CAUGHT" if failed else "MISSED") if old else ("passes" if ok else "FAILS")
            print(f"{name}: failed checks per rank ipc={results['1']} staged={results['0']} -> {verdict}",
                  flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
