"""jax_ext's mesh-level ops among the devices of one process against jax.lax's, one session.

    python benchmarks/jax_mesh_local.py [--devices 4] [--sizes 8,1M] [--ops 100] [--calls 30] [--repeats 5]
                                        [--out docs/bench/jax-mesh-local]

One process with ``--devices`` CPU devices, a 1-D mesh of them, ``shard_map`` over a jitted ``fori_loop`` of
``--ops`` collectives (psum, and ppermute around the ring), ``--sizes`` bytes of float32 per device. Four
variants of each, traced in one process: ``lax`` (jax.lax's op), ``jax_ext`` (the default,
``AIOCCL_JAX_MESH=auto``: aioccl's native custom call for small ops, XLA's collective from 128 KiB per device;
jax_ext/in_process.py), ``jax_ext xla`` (XLA's at every size) and ``jax_ext aioccl`` (aioccl's at every size,
as before). A run times ``--calls`` calls of each (``block_until_ready`` each) in
rotating order and keeps the median per call; the table gives the median over ``--repeats`` runs and lax's
time over each variant's (1.0x: as fast as lax; higher: faster). Writes ``jax_mesh_local.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("lax", "jax_ext", "jax_ext xla", "jax_ext aioccl")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def build(op: str, variant: str, nbytes: int, ops: int, n: int):  # noqa: ANN201 - (a jitted function, its input)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_ext

    os.environ["AIOCCL_JAX_MESH"] = variant.split()[1] if " " in variant else "auto"  # read when traced
    lib = jax.lax if variant == "lax" else jax_ext
    ring = [(i, (i + 1) % n) for i in range(n)]

    def step(_: object, a: jax.Array) -> jax.Array:
        if op == "psum":
            return lib.psum(a, "i") * 0.25
        return lib.ppermute(a, "i", ring)

    mesh = Mesh(np.array(jax.devices()[:n]), ("i",))
    f = jax.jit(jax.shard_map(lambda v: jax.lax.fori_loop(0, ops, step, v), mesh=mesh, in_specs=P("i"),
                              out_specs=P("i"), check_vma=False))
    x = jnp.arange(n * max(1, nbytes // 4), dtype=jnp.float32) % 7
    f(x).block_until_ready()  # compiled, and the first calls (aioccl's: learning) done
    f(x).block_until_ready()
    return f, x


def run(args: argparse.Namespace) -> dict:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    sys.path.insert(0, str(ROOT))
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    cases = [(op, s) for op in ("psum", "ppermute") for s in sizes]
    fns = {(op, s, v): build(op, v, s, args.ops, args.devices) for op, s in cases for v in VARIANTS}
    runs: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        for op, s in cases:
            order = VARIANTS[rep % len(VARIANTS):] + VARIANTS[:rep % len(VARIANTS)]
            for v in order:
                f, x = fns[(op, s, v)]
                times = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    f(x).block_until_ready()
                    times.append(time.perf_counter() - t0)
                runs.setdefault(f"{op}|{s}|{v}", []).append(statistics.median(times) * 1e6)
            print(f"repeat {rep} {op} {label(s)}: " + ", ".join(
                f"{v} {runs[f'{op}|{s}|{v}'][-1]:.0f} us" for v in VARIANTS), flush=True)
    return {"args": vars(args), "runs": runs, "uptime": os.getloadavg()}


def table(result: dict) -> str:
    args = result["args"]
    lines = [f"# jax_ext mesh-level ops in one process ({args['devices']} CPU devices) against jax.lax", "",
             f"Per jitted call of a `fori_loop` of {args['ops']} ops in `shard_map`, median of {args['calls']} "
             f"calls per run, median over {args['repeats']} runs; lax / variant: 1.0x is lax's speed. "
             f"`python benchmarks/jax_mesh_local.py`. Load at the end: {result['uptime'][0]:.2f}.", "",
             "| op | per device | lax us | " + " | ".join(f"{v} us | lax / {v}" for v in VARIANTS[1:]) + " |",
             "|---|---|---|" + "---|---|" * (len(VARIANTS) - 1)]
    for op in ("psum", "ppermute"):
        for s in [parse_size(t) for t in args["sizes"].split(",")]:
            med = {v: statistics.median(result["runs"][f"{op}|{s}|{v}"]) for v in VARIANTS}
            lines.append(f"| {op} | {label(s)} | {med['lax']:.0f} | " + " | ".join(
                f"{med[v]:.0f} | {med['lax'] / med[v]:.2f}x" for v in VARIANTS[1:]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--sizes", default="8,1M")
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "jax-mesh-local"))
    args = ap.parse_args()
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "jax_mesh_local.json").write_text(json.dumps(result, indent=1) + "\n")
    md = table(result)
    (out / "jax_mesh_local.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
