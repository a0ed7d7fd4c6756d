"""Reproducible background loads for "busy machine" benchmarks: what else runs beside the ranks.

    with load("mixed"):
        ...time something...

- ``none``: nothing;
- ``hog1``, ``hog2``: one or two CPU-bound processes (``while True: pass``);
- ``mixed``: what a multi-process test suite does beside you: three workers, each
  a seeded loop of starting a short Python process, sleeping 1-20 ms,
  writing and fsyncing 256 KiB, and computing for 1-10 ms. Seeded, so
  every library meets the same sequence.

Every load is started before, and stopped (its process group killed) after, each timed run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

LOADS = ("none", "hog1", "hog2", "mixed")
MIXED_WORKERS = 3
SHORT_JOB = "import json, zlib; zlib.compress(json.dumps(list(range(20000))).encode())"


def mixed_worker(seed: int) -> None:
    rng = random.Random(seed)
    fd, path = tempfile.mkstemp(prefix="aioccl-load-")
    os.unlink(path)  # gone with the process, however it ends
    block = os.urandom(256 * 1024)
    try:
        while True:
            action = rng.choice(("spawn", "sleep", "io", "compute"))
            if action == "spawn":
                subprocess.run([sys.executable, "-c", SHORT_JOB], check=False)
            elif action == "sleep":
                time.sleep(rng.uniform(0.001, 0.02))
            elif action == "io":
                os.lseek(fd, 0, 0)
                os.write(fd, block)
                os.fsync(fd)
            else:
                end = time.perf_counter() + rng.uniform(0.001, 0.01)
                while time.perf_counter() < end:
                    pass
    finally:
        os.close(fd)


def _start(kind: str) -> list[subprocess.Popen[bytes]]:
    if kind == "none":
        return []
    if kind.startswith("hog"):
        cmds = [[sys.executable, "-c", "while True: pass"]] * int(kind[3:])
    elif kind == "mixed":
        cmds = [[sys.executable, __file__, "--mixed-worker", str(i)] for i in range(MIXED_WORKERS)]
    else:
        raise ValueError(f"unknown load {kind!r}: one of {', '.join(LOADS)}")
    return [subprocess.Popen(c, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for c in cmds]


@contextlib.contextmanager
def load(kind: str) -> Iterator[None]:
    procs = _start(kind)
    try:
        time.sleep(0.3 if procs else 0)  # running before the ranks start
        yield
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--mixed-worker":
        mixed_worker(int(sys.argv[2]))
    else:
        with load(sys.argv[1] if len(sys.argv) > 1 else "mixed"):
            time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 10)
