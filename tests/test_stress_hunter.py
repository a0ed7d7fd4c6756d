"""The hang hunter (``make stress``, scripts/stress.py) itself: a run that hangs is caught, its evidence kept, its
processes gone. Its loops over the real tests run outside CI (tests/README.md, "The hang hunter")."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import ROOT

HANGING_TEST = '''
import subprocess, sys

def test_two_ranks_one_never_sends():
    subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", {worker!r}], timeout=600)
'''

WORKER = '''
import asyncio
import numpy as np
import aioccl

async def main():
    async with await aioccl.init() as comm:
        await comm.all_reduce(np.ones(4))  # a finished op for the flight recorder
        if comm.rank == 0:
            await comm.recv(np.zeros(4), 1, tag=7)  # never sent: the hang
        else:
            await asyncio.sleep(3600)

asyncio.run(main())
'''


def test_a_hang_is_caught_with_every_ranks_stacks_dumps_and_seed(tmp_path):
    worker = tmp_path / "hang_worker.py"
    worker.write_text(WORKER)
    test = tmp_path / "test_hangs.py"
    test.write_text(HANGING_TEST.format(worker=str(worker)))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "stress.py"), "--minutes", "0", "--stall", "8",
                          "--watchdog", "1", "--out", str(out), "--files", str(test)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 1, run.stdout + run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["hang"]) == 1 and not summary["pass"] and not summary["fail"], summary
    seed = summary["hang"][0]
    assert f"seed {seed}: hang" in run.stdout, run.stdout
    (where,) = [p for p in out.iterdir() if p.is_dir()]
    assert f"--replay {seed}" in (where / "seed.txt").read_text()
    # each rank wrote its pending ops and flight recorder when the watchdog first logged its op
    dumps = {p.name.split("-")[0]: p.read_text() for p in (where / "hang-dumps").iterdir()}
    assert "recv(peer=1, tag=7)" in dumps["rank0"].split("flight recorder")[0], dumps
    assert "all_reduce seq 0" in dumps["rank0"].split("flight recorder")[1], dumps
    # stacks of the ranks, the launcher and pytest, taken before anything was killed
    stacks = [p.read_text() for p in where.glob("stacks-*.txt")]
    assert sum("hang_worker.py" in s.splitlines()[0] for s in stacks) >= 2, [s[:300] for s in stacks]
    assert (where / "pytest.log").read_bytes().count(b"test_two_ranks_one_never_sends") >= 1
    # nothing of the run is left
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(worker) not in ps, textwrap.shorten(ps, 2000)
