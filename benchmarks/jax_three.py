"""jax_ext against the real mpi4jax and jax.lax.psum, inside jitted programs, in one run.

    mpirun -np 2 python benchmarks/jax_three.py [--sizes 8,64K,16M] [--repeats 3] [--libs jax_ext,mpi4jax,lax.psum]
                                                [--ops all_reduce,sendrecv] [--out docs/bench/jax-three]

(``make bench-jax`` runs it from the benchmark venv, where mpi4jax is built from PyPI's sdist against
Debian's Open MPI.) The processes are MPI's: mpi4py hands aioccl its unique id and jax.distributed its
coordinator, so all three libraries run on the same processes, one CPU device each (lax.psum on
XLA's Gloo collectives). Per op and size, on float32: all-reduces of sum (``all_reduce``), and exchanges
around the ring (``sendrecv``: send to the next rank, receive from the previous; lax's column runs the
same ``ppermute`` in a ``shard_map``), each timed

- ``loop``: 50 ops in one jitted ``fori_loop``, per op;
- ``unrolled``: 50 ops written out in one jitted function, per op;
- ``call``: one jitted call holding one op (what a step with one collective pays, dispatch included).

Each figure: the slower rank's median over ``--iters`` calls, then the median over ``--repeats`` sets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

OPS = 50


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def time_op(world: Any, op: Any, x: Any, nbytes: int, args: Any) -> dict[str, float]:
    """Per case, in us: the slower rank's median per op, then the median over repeats."""
    import jax

    shrink = 1.0 / world.Get_size()  # keeps the values bounded over 50 ops

    def loop(v: Any) -> Any:
        return jax.lax.fori_loop(0, OPS, lambda i, a: op(a) * shrink, v)

    def unrolled(v: Any) -> Any:
        for _ in range(OPS):
            v = op(v) * shrink
        return v

    us = {}
    for case, fn, per in (("loop", loop, OPS), ("unrolled", unrolled, OPS), ("call", op, 1)):
        if case == "unrolled" and nbytes > 1 << 20:
            continue  # 50 copies of a 16 MiB op in one program: minutes of compiling, nothing new
        f = jax.jit(fn)
        f(x).block_until_ready()
        sets = []
        for _ in range(args.repeats):
            world.Barrier()
            times = []
            for _ in range(args.iters if nbytes < 1 << 20 else max(5, args.iters // 3)):
                t = time.perf_counter()
                f(x).block_until_ready()
                times.append((time.perf_counter() - t) / per)
            sets.append(max(world.allgather(statistics.median(times))))
        us[case] = statistics.median(sets) * 1e6
    return us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,64K,16M")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--libs", default="jax_ext,mpi4jax,lax.psum")
    ap.add_argument("--ops", default="all_reduce,sendrecv")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    coord = world.bcast(f"127.0.0.1:{29000 + os.getpid() % 1000}" if rank == 0 else None, root=0)

    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coord, size, rank)
    import jax.numpy as jnp
    import mpi4jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import aioccl
    import jax_ext

    uid = world.bcast(str(aioccl.UniqueId.new(host="127.0.0.1")) if rank == 0 else None, root=0)
    comm = aioccl.Communicator.create_sync(aioccl.UniqueId.parse(uid), rank, size)
    jax_ext.set_default_comm(comm)
    mesh = jax.make_mesh((jax.device_count(),), ("i",))

    nxt, prv = (rank + 1) % size, (rank - 1) % size
    ring = [(j, (j + 1) % size) for j in range(size)]

    def lax_op(v: Any) -> Any:
        return jax.shard_map(lambda a: jax.lax.psum(a, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(v)

    def lax_shift(v: Any) -> Any:
        return jax.shard_map(lambda a: jax.lax.ppermute(a, "i", ring), mesh=mesh, in_specs=P("i"),
                             out_specs=P("i"))(v)

    ops = {  # each op times `size` over `shrink` in the loops: values stay bounded
        "all_reduce": {
            "jax_ext": lambda v: jax_ext.all_reduce(v),
            "mpi4jax": lambda v: mpi4jax.allreduce(v, op=MPI.SUM, comm=world),
            "lax.psum": lax_op,
        },
        "sendrecv": {
            "jax_ext": lambda v: jax_ext.sendrecv(v, source=prv, dest=nxt) * size,
            "mpi4jax": lambda v: mpi4jax.sendrecv(v, v, source=prv, dest=nxt, comm=world) * size,
            "lax.psum": lambda v: lax_shift(v) * size,  # (lax's column: ppermute, for this op)
        },
    }
    wanted = args.libs.split(",")
    results: dict[str, Any] = {}
    for op_name in args.ops.split(","):
        for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
            count = max(1, nbytes // 4)
            local = np.ones(count, np.float32)
            glob = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
            for lib, op in ops[op_name].items():
                if lib not in wanted:
                    continue
                x = glob if lib == "lax.psum" else jnp.asarray(local)
                for case, us in time_op(world, op, x, nbytes, args).items():
                    named = "" if op_name == "all_reduce" else f"{op_name} "  # (all-reduce: the earlier files' keys)
                    results[f"{lib} {named}{case} {nbytes}"] = us
                    if rank == 0:
                        print(f"{lib:9s} {op_name:10s} {case:9s} {nbytes:>9d} B  {us:10.1f} us", flush=True)
    if rank == 0:
        print("jax_ext native calls:", jax_ext.native_call.stats(), flush=True)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            name = "jax_three.json" if os.environ.get("AIOCCL_NATIVE", "1") != "0" else "jax_three_python.json"
            (out / name).write_text(json.dumps(
                {"jax": jax.__version__, "mpi4jax": mpi4jax.__version__, "ranks": size, "us": results}, indent=1))
    comm.close().wait()


if __name__ == "__main__":
    main()
