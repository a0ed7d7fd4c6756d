"""``aioccl-sim``: predicted time and bus bandwidth of every algorithm, up to thousands of ranks.

    aioccl-sim all_reduce --link 100g --ranks 8,64,512,4096 --sizes 8,64K,1M,64M,1G [--json F] [--plot F.png]
    aioccl-sim all_reduce --link 100g --per-host 8 --ranks 16,512,4096   # hosts of 8 ranks: hierarchies too

It runs the very schedules the engine runs (``aioccl.algorithms.plan``)
under the alpha-beta model of ``aioccl.algorithms.cost``, and marks with
``*`` the algorithm the tuner picks. ``--links`` lists the link models.
With ``--per-host N`` the ranks sit on hosts of N (the last one may hold
fewer): messages inside a host take the ``same-host`` link, the others
``--link``, and the hierarchical algorithms (``rail``, ``leader``) compete.
``--streams K`` caps the network at K times what one TCP stream's copies
move (``--stream-rate``, one core's worth): what ``AIOCCL_NSOCKS`` buys.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..algorithms import ALGORITHMS
from ..algorithms.cost import LINKS, STREAM_RATE, Hosts, Link, predict, with_streams
from ..algorithms.hierarchy import HIERARCHICAL, spans_hosts
from ..algorithms.table import TABLE
from ..tuning import Tuning, candidates
from .perf import DTYPES, parse_size
from .perf_cases import busbw_factor

SIM_COLLS = tuple(c.name for c in TABLE if c.name != "barrier")
BLOCKWISE = tuple(c.name for c in TABLE if c.blockwise)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="aioccl-sim", description=__doc__.split("\n\n")[0])
    p.add_argument("coll", nargs="?", default="all_reduce", choices=SIM_COLLS)
    p.add_argument("--link", default="100g", choices=list(LINKS))
    p.add_argument("--ranks", default="2,8,64,512,4096")
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,256M,1G", help="bytes of the whole buffer, as nccl-tests")
    p.add_argument("-d", "--datatype", default="float32", choices=list(DTYPES))
    p.add_argument("--per-host", type=int, default=0, metavar="N", help="ranks per host (0: the --link between all)")
    p.add_argument("--streams", type=int, default=0, metavar="K",
                   help="TCP streams per pair (AIOCCL_NSOCKS), each moving at most --stream-rate; "
                        "0 (default): the link alone (RDMA, or a NIC slower than one stream)")
    p.add_argument("--stream-rate", type=float, default=STREAM_RATE / 1e9, metavar="GB/s",
                   help="one stream's copies on one core (default: measured here, benchmarks/socket_path.py)")
    p.add_argument("--buffsize", type=parse_size, default=parse_size("4M"), help="chunk in bytes (AIOCCL_BUFFSIZE)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--plot", metavar="FILE.png")
    p.add_argument("--links", action="store_true", help="list the link models and exit")
    ns = p.parse_args(argv)
    try:
        ns.rank_list = [int(x) for x in ns.ranks.split(",")]
        ns.size_list = [parse_size(x) for x in ns.sizes.split(",")]
    except (ValueError, argparse.ArgumentTypeError) as e:
        p.error(str(e))
    if min(ns.rank_list) < 1 or max(ns.rank_list) > 8192:
        p.error("ranks must be in 1..8192")
    if ns.per_host < 0:
        p.error("--per-host must be >= 0")
    if not 0 <= ns.streams <= 16 or ns.stream_rate <= 0:
        p.error("--streams must be in 0..16 and --stream-rate > 0")
    return ns


def points(ns: argparse.Namespace) -> list[dict[str, Any]]:
    link, item = network(ns), DTYPES[ns.datatype].itemsize
    tuning = Tuning(buffsize=ns.buffsize, link=link)
    chunk = tuning.chunk(item)
    out = []
    for n in ns.rank_list:
        for size in ns.size_list:
            count = size // item
            if ns.coll in BLOCKWISE:
                count //= n  # plan() takes the per-rank block for these
            if count == 0:
                continue
            nbytes = count * item * (n if ns.coll in BLOCKWISE else 1)
            layout = layout_of(n, ns.per_host)
            hosts = Hosts(layout) if spans_hosts(layout) else None
            algos = {}
            for algo in candidates(ns.coll, layout):
                t = predict(ns.coll, algo, count, n, link, item, chunk, hosts)
                algos[algo] = {"time_us": t * 1e6, "busbw": nbytes / t / 1e9 * busbw_factor(ns.coll, n) if t else 0}
            chosen = tuning.choose(ns.coll, count, item, n, layout)[0]
            out.append({"ranks": n, "bytes": nbytes, "algos": algos, "tuner": chosen})
    return out


def network(ns: argparse.Namespace) -> Link:
    """The ``--link``, capped by what ``--streams`` streams per pair can copy (when given)."""
    link = LINKS[ns.link]
    return with_streams(link, ns.streams, ns.stream_rate * 1e9) if ns.streams else link


def layout_of(n: int, per_host: int) -> tuple[int, ...]:
    """Ranks filling hosts of ``per_host`` in order (``()``: no hosts, one link between all)."""
    return tuple(r // per_host for r in range(n)) if per_host else ()


def main(argv: list[str] | None = None) -> None:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    if ns.links:
        for link in LINKS.values():
            print(f"{link.name:>10}  alpha {link.alpha * 1e6:6.1f} us  {1 / link.beta / 1e9:6.2f} GB/s  "
                  f"reduce {1 / link.gamma / 1e9:5.1f} GB/s  {link.description}")
        return
    link = network(ns)
    algos = ALGORITHMS[ns.coll] + (HIERARCHICAL.get(ns.coll, ()) if ns.per_host > 1 else ())
    where = f", hosts of {ns.per_host} ranks (same-host link inside)" if ns.per_host else ""
    print(f"# aioccl-sim {ns.coll} {ns.datatype} on '{link.name}' (alpha {link.alpha * 1e6:g} us, "
          f"{1 / link.beta / 1e9:g} GB/s){where}; * = the tuner's choice; - = not for this layout")
    print(f"# {'ranks':>6} {'size(B)':>12}" + "".join(f" {a + ' time(us)':>18} {'busbw':>8}" for a in algos))
    rows = points(ns)
    for row in rows:
        cells = "".join(f" {('*' if a == row['tuner'] else '') + format(row['algos'][a]['time_us'], '.1f'):>18}"
                        f" {row['algos'][a]['busbw']:>8.2f}" if a in row["algos"] else f" {'-':>18} {'-':>8}"
                        for a in algos)
        print(f"  {row['ranks']:>6} {row['bytes']:>12}{cells}")
    report = {"tool": "aioccl-sim", "coll": ns.coll, "dtype": ns.datatype, "link": link.__dict__,
              "per_host": ns.per_host,
              "buffsize": ns.buffsize, "rows": rows}
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(report, f, indent=1)
    if ns.plot:
        from .sim_plot import plot

        plot(report, ns.plot)


if __name__ == "__main__":
    main()
