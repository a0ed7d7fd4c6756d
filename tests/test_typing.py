"""A user's program type-checks against the public API under ``mypy --strict``, with the types it expects."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

USER = '''
import asyncio

import numpy as np

import aioccl


async def main(comm: aioccl.Communicator) -> None:
    reveal_type(comm.barrier())
    reveal_type(await comm.split(1))
    reveal_type(await comm.shrink())
    reveal_type(comm.isend(np.ones(2), 1))
    reveal_type(comm.close())
    reveal_type(comm.rank)
    done: aioccl.Work[None] = comm.barrier()
    await done
    try:
        await comm.all_reduce(np.ones(2), op=aioccl.ReduceOp.MAX, timeout=1.0)
    except aioccl.CollectiveTimeout as e:
        reveal_type(e.waiting_for)


def sync() -> None:
    comm = aioccl.init_sync()
    comm.all_gather(np.zeros(3)).wait(timeout=5.0)
    asyncio.run(main(comm))
'''

EXPECTED = [
    'Revealed type is "aioccl.work.Work[None]"',
    'Revealed type is "aioccl.communicator.Communicator | None"',
    'Revealed type is "aioccl.communicator.Communicator"',
    'Revealed type is "aioccl.work.Work[None]"',
    'Revealed type is "aioccl.work.Work[None]"',
    'Revealed type is "int"',
    'Revealed type is "list[int]"',
]


def test_user_code_type_checks_strict(tmp_path):
    (tmp_path / "user.py").write_text(USER)
    p = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file", "/dev/null",
                        str(tmp_path / "user.py")], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "MYPYPATH": str(ROOT)})
    # older mypy spells builtins out ("builtins.int")
    notes = [ln.split("note: ", 1)[1].replace("builtins.", "") for ln in p.stdout.splitlines()
             if "note: Revealed" in ln]
    errors = [ln for ln in p.stdout.splitlines() if ": error:" in ln]
    assert errors == [], p.stdout
    assert notes == EXPECTED, p.stdout
