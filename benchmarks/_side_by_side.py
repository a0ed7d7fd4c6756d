"""Running one library's worker processes for a side-by-side benchmark (small_ops.py, pipeline.py), and
writing its table and raw points.

aioccl's ranks start under ``aioccl-run`` with its inline engine, each bound to a core as ``mpirun`` binds
its ranks (for at most 2 ranks here: beyond, mpirun binds to sockets and aioccl-run, with more ranks than
cores, to nothing); Open MPI's under ``mpirun``. No
``AIOCCL_*`` setting of the caller's leaks into either. A worker prints its results as JSON lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_workers(lib: str, n: int, script: str, args: list[str], what: str) -> list[dict]:
    """``script --worker lib *args`` on ``n`` ranks; the JSON lines they print. ``what`` names the run
    in an error."""
    argv = [str(Path(script).resolve()), "--worker", lib, *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOCCL_")}
    if lib == "mpi":
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), sys.executable, *argv]
    else:
        cmd = [sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(n), "--no-prefix", "--bind-to", "core",
               *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{lib} at {n} ranks{what} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]


def report(lines: list[str], out: str, name: str, data: dict) -> None:
    """Print the table; with ``out``, write it as ``<name>.md`` and the raw points as ``<name>.json`` there."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.md").write_text(text)
        (folder / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
