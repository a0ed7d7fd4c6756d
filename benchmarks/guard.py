"""The performance guard: which of aioccl's ratios to its peers moved since the stored reference (by hand).

    python benchmarks/guard.py NEW.json [--reference docs/bench/compare.json] [--tolerance 0.15]

Machines differ ~3x in absolute speed, so a figure is never compared with the reference's microseconds:
each aioccl time is divided by each peer's time for the same op, rank count and size *in the same run*
(Open MPI, Gloo), and that ratio is compared with the same ratio in the reference. Every ratio that moved
by more than ``--tolerance`` is named, slower first; the exit status is 1 when one got slower. Reads
``compare.py``'s JSON (``make bench``) and ``small_ops.py``'s; only points present in both files count.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PEERS = ("mpi", "gloo")


def figures(path: Path) -> dict[tuple[str, int, int], dict[str, float]]:
    """(op, ranks, bytes) -> {library: median us} of one run."""
    doc = json.loads(path.read_text())
    rows = doc.get("results")
    if rows is None:  # small_ops.py: every repeat's point; the median per library is taken here
        import statistics

        per: dict[tuple[str, int, int, str], list[float]] = {}
        for p in doc["points"]:
            per.setdefault((p["op"], p["ranks"], doc["bytes"], p["lib"]), []).append(p["us"])
        rows = [{"op": k[0], "ranks": k[1], "bytes": k[2], "lib": k[3], "median_us": statistics.median(v)}
                for k, v in per.items()]
    out: dict[tuple[str, int, int], dict[str, float]] = {}
    for r in rows:
        if r.get("load", "none") != "none":
            continue
        out.setdefault((r["op"], r["ranks"], r["bytes"]), {})[r["lib"]] = r["median_us"]
    return out


def ratios(figs: dict[tuple[str, int, int], dict[str, float]]) -> dict[tuple[str, int, int, str, str], float]:
    """(op, ranks, bytes, aioccl library, peer) -> aioccl's time over the peer's (below 1: aioccl faster)."""
    out = {}
    for key, libs in figs.items():
        for lib, t in libs.items():
            if lib.startswith("aioccl"):
                for peer in PEERS:
                    if libs.get(peer):
                        out[(*key, lib, peer)] = t / libs[peer]
    return out


def size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("new", type=Path)
    p.add_argument("--reference", type=Path, default=Path(__file__).resolve().parent.parent / "docs/bench/compare.json")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--summary", action="store_true", help="counts per library, peer and direction, not every ratio")
    a = p.parse_args(argv)
    cpus = [json.loads(f.read_text()).get("meta", {}).get("versions", {}).get("cpu", "not recorded")
            for f in (a.new, a.reference)]
    if cpus[0] != cpus[1]:
        print(f"note: another processor ({cpus[0]}; the reference: {cpus[1]}): a ratio moves with the machine too")
    new, ref = ratios(figures(a.new)), ratios(figures(a.reference))
    common = sorted(set(new) & set(ref))
    moved = []
    for k in common:
        change = new[k] / ref[k] - 1
        if abs(change) > a.tolerance:
            moved.append((change, k))
    moved.sort(key=lambda m: -m[0])
    print(f"{len(common)} ratios in both runs; {len(moved)} moved by more than {a.tolerance:.0%} "
          f"({a.new} against {a.reference})")
    if a.summary:
        for word, sign in (("slower", 1), ("faster", -1)):
            for lib in sorted({k[3] for _, k in moved}):
                for peer in PEERS:
                    got = [(c, k) for c, k in moved if k[3] == lib and k[4] == peer and c * sign > 0]
                    if got:
                        sizes = sorted({k[2] for _, k in got})
                        print(f"  {word}: {lib} / {peer}: {len(got)} ratios, sizes {', '.join(map(size, sizes))}")
        return 1 if any(c > 0 for c, _ in moved) else 0
    for change, (op, n, nbytes, lib, peer) in moved:
        word = "slower" if change > 0 else "faster"
        print(f"  {word:6} {change:+7.0%}  {op} {n} ranks {size(nbytes)}: {lib} / {peer} "
              f"{ref[(op, n, nbytes, lib, peer)]:.2f}x -> {new[(op, n, nbytes, lib, peer)]:.2f}x")
    return 1 if any(c > 0 for c, _ in moved) else 0


if __name__ == "__main__":
    sys.exit(main())
