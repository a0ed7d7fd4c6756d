"""Several hosts on one machine: hierarchical against flat collectives across network namespaces.

    sudo python benchmarks/multihost.py --hosts 2 --per-host 2 --sizes 1M,64M --repeats 3 --out docs/bench
    sudo python benchmarks/multihost.py --rate 1gbit ...   # the link between the hosts capped (tc tbf)

Each "host" is a network namespace; they are joined by a bridge in another
namespace through veth pairs, so ranks of one host talk over shared memory
and ranks of different hosts over TCP across the veths (what aioccl sees as
another host). aioccl-perf runs under ``aioccl-run --nnodes H`` once per
variant and size: ``auto`` (the tuner's choice, hierarchical here),
``ring`` (the flat socket ring over all ranks, forced with ``AIOCCL_ALGO``),
``rail`` and ``leader`` forced, ``auto-x2`` (two TCP streams per pair
across hosts, ``AIOCCL_NSOCKS=2``), and ``ring-tcp`` (the flat ring with same-host
pairs over sockets too, ``AIOCCL_SHM_DISABLE=1``). The variants run back to back in rotating
order in each repeat; each figure is the median over repeats of a run's
median per-iteration time. Open MPI across namespaces would need its
launcher to reach each namespace (ssh); it is not run here. Needs root.
Writes multihost.md and multihost.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from _sweep import iterations  # noqa: E402

from aioccl.tools.perf import parse_size  # noqa: E402

VARIANTS: dict[str, dict[str, str]] = {
    "auto": {}, "ring": {"AIOCCL_ALGO": "all_reduce:ring"}, "rail": {"AIOCCL_ALGO": "all_reduce:rail"},
    "leader": {"AIOCCL_ALGO": "all_reduce:leader"},
    "ring-tcp": {"AIOCCL_ALGO": "all_reduce:ring", "AIOCCL_SHM_DISABLE": "1"},  # every pair over sockets
    "auto-x2": {"AIOCCL_NSOCKS": "2"},  # the tuner's choice, two TCP streams per pair across hosts
    "mpi": {},  # Open MPI, not aioccl (run_mpi)
}


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@contextlib.contextmanager
def namespaces(n: int, rate: str | None) -> Iterator[tuple[list[str], list[str]]]:
    """``n`` namespaces on one bridge; yields their names and addresses. ``rate``: each host's link capped."""
    tag = os.getpid() % 1000
    ns, bridge, subnet = [f"aiob{tag}h{i}" for i in range(n)], f"aiob{tag}br", f"10.216.{tag % 250}"
    addrs = [f"{subnet}.{i + 1}" for i in range(n)]
    try:
        _sh("ip", "netns", "add", bridge)
        _sh("ip", "-n", bridge, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", bridge, "link", "set", "br0", "up")
        for i, name in enumerate(ns):
            dev, peer = f"eb{tag}h{i}", f"pb{tag}h{i}"
            _sh("ip", "netns", "add", name)
            _sh("ip", "-n", name, "link", "set", "lo", "up")
            _sh("ip", "link", "add", dev, "netns", name, "type", "veth", "peer", "name", peer, "netns", bridge)
            _sh("ip", "-n", bridge, "link", "set", peer, "master", "br0")
            _sh("ip", "-n", bridge, "link", "set", peer, "up")
            _sh("ip", "-n", name, "addr", "add", f"{addrs[i]}/24", "dev", dev)
            _sh("ip", "-n", name, "link", "set", dev, "up")
            if rate:
                _sh("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", "256kb", "latency", "50ms")
        yield ns, addrs
    finally:
        for name in [*ns, bridge]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def run_mpi(ns: list[str], addrs: list[str], per_host: int, size: int) -> dict:
    """Open MPI's all_reduce across the namespace hosts (see the module's docstring)."""
    subnet = addrs[0].rsplit(".", 1)[0] + ".0/24"
    with tempfile.TemporaryDirectory() as tmp:
        agent = Path(tmp) / "nsrsh"
        cases = "".join(f"  {a}) ns={n}; name=h{i};;\n" for i, (a, n) in enumerate(zip(addrs, ns, strict=True)))
        agent.write_text("#!/bin/sh\n# mpirun's remote shell: the daemon in the named host's namespace\n"
                         f'host="$1"; shift\ncase "$host" in\n{cases}  *) echo "unknown host $host" >&2; exit 1;;\n'
                         'esac\nexec ip netns exec "$ns" unshare --uts sh -c "hostname $name; $*"\n')
        agent.chmod(0o755)
        mpirun = ["mpirun", "--allow-run-as-root", "-np", str(len(ns) * per_host),
                  "--host", ",".join(f"{a}:{per_host}" for a in addrs), "--mca", "plm_rsh_agent", str(agent),
                  "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", subnet,
                  "--mca", "oob_tcp_if_include", subnet,
                  # the hosts share 2 cores: yield when idle, as compare.py's --oversubscribe does on one host
                  "--mca", "mpi_yield_when_idle", "1", sys.executable, str(HERE / "peer_mpi.py"),
                  "--op", "all_reduce", "--sizes", str(size)]
        cmd = ["ip", "netns", "exec", ns[0], "unshare", "--uts", "sh", "-c", 'hostname h0; exec "$@"', "sh", *mpirun]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"mpi {size}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    row = next(json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{"))
    n = len(ns) * per_host
    return {"variant": "mpi", "bytes": size, "median_us": row["median_us"],
            "busbw": size / (row["median_us"] * 1e-6) / 1e9 * 2 * (n - 1) / n}


def run_once(ns: list[str], addrs: list[str], per_host: int, variant: str, size: int, port: int) -> dict:
    if variant == "mpi":
        return run_mpi(ns, addrs, per_host, size)
    iters, warm = iterations(size)
    secret = secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOCCL_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(VARIANTS[variant])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        procs = []
        for node, name in enumerate(ns):
            cmd = ["ip", "netns", "exec", name, sys.executable, "-m", "aioccl.run", "--nnodes", str(len(ns)),
                   "--node-rank", str(node), "--master-addr", addrs[0], "--master-port", str(port),
                   "--nproc-per-node", str(per_host), "--secret", secret, "-m", "aioccl.tools.perf", "all_reduce",
                   "--sizes", str(size), "-n", str(iters), "-w", str(warm), "--json", str(out), "--no-progress"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = [p.communicate(timeout=900) for p in procs]
        for p, (o, e) in zip(procs, results, strict=True):
            if p.returncode:
                raise SystemExit(f"{variant} {size}: exit {p.returncode}\n{o[-2000:]}\n{e[-2000:]}")
        report = json.loads(out.read_text())
    row = report["rows"][0]["in_place"]
    if row["wrong"]:
        raise SystemExit(f"{variant} {size}: {row['wrong']} wrong elements")
    t = row["median_us"] * 1e-6
    n = len(ns) * per_host
    return {"variant": variant, "bytes": size, "median_us": row["median_us"],
            "busbw": size / t / 1e9 * 2 * (n - 1) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--sizes", default="1M,64M")
    ap.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "mpi"), help=", ".join(VARIANTS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", default=None, help="cap each host's link (tc tbf rate, e.g. 1gbit)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    variants = args.variants.split(",")
    runs: dict[tuple[str, int], list[dict]] = {}
    port = 29700 + os.getpid() % 200
    with namespaces(args.hosts, args.rate) as (ns, addrs):
        for rep in range(args.repeats):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for size in sizes:
                for v in order:
                    port += 2
                    res = run_once(ns, addrs, args.per_host, v, size, port)
                    runs.setdefault((v, size), []).append(res)
                    print(f"repeat {rep + 1}/{args.repeats} {v:>6} {size:>10} B: {res['median_us']:.1f} us, "
                          f"busbw {res['busbw']:.3f} GB/s", flush=True)
    link = f", each host's link capped at {args.rate}" if args.rate else ""
    lines = [f"Command: `benchmarks/multihost.py --hosts {args.hosts} --per-host {args.per_host} --sizes {args.sizes} "
             f"--variants {args.variants} --repeats {args.repeats}"
             + (f" --rate {args.rate}" if args.rate else "") + "`",
             f"{args.hosts} namespace hosts x {args.per_host} ranks{link}; all_reduce float32 in place, "
             f"medians of {args.repeats} runs", "",
             "| size | " + " | ".join(f"{v} us | {v} busbw" for v in variants) + " | ring / auto | mpi / auto |",
             "|---" * (2 * len(variants) + 3) + "|"]
    for size in sizes:
        med = {v: statistics.median(r["median_us"] for r in runs[(v, size)]) for v in variants}
        bw = {v: statistics.median(r["busbw"] for r in runs[(v, size)]) for v in variants}
        ratio = f"{med['ring'] / med['auto']:.2f}x" if "ring" in med and "auto" in med else "-"
        mpi = f"{med['mpi'] / med['auto']:.2f}x" if "mpi" in med and "auto" in med else "-"
        lines.append(f"| {size} | " + " | ".join(f"{med[v]:.1f} | {bw[v]:.3f}" for v in variants)
                     + f" | {ratio} | {mpi} |")
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = "multihost" + (f"_{args.rate}" if args.rate else "")
        (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
        (out / f"{stem}.json").write_text(json.dumps({f"{v} {s}": r for (v, s), r in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
