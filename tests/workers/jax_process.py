"""Process-level jax_ext ops (one device per process) under jit, checked element by element.

Run under ``aioccl-run`` (the default communicator comes from its
environment) or, with ``JAXW_COORD``/``JAXW_NPROC``/``JAXW_PID``, under
``jax.distributed`` (the unique id travels through JAX's key-value store).
Prints ``JAXP OK <checks>`` at the end; any failure raises.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

if os.environ.get("JAXW_COORD"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # lax.psum across the processes, below
    jax.distributed.initialize(os.environ["JAXW_COORD"], int(os.environ["JAXW_NPROC"]), int(os.environ["JAXW_PID"]))

import jax_ext  # noqa: E402
from jax_ext._primitive import counts  # noqa: E402

comm = jax_ext.default_comm()
r, n = comm.rank, comm.world_size
checks = 0


def data(rank: int, shape: tuple[int, ...], dtype: str = "float32", salt: int = 0) -> np.ndarray:
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    return ((base * 3 + rank * 7 + salt) % 23 - 11).astype(dtype)


def same(got, want, label: str) -> None:
    global checks
    got = np.asarray(got)
    want = np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        print(f"JAXP FAIL {label} on rank {r}: got {got.dtype}{got.shape}\n{got}\nwant {want.dtype}{want.shape}\n"
              f"{want}", flush=True)
        sys.exit(1)
    checks += 1


everyone = [data(q, (4, 3)) for q in range(n)]
mine = jnp.asarray(everyone[r])
total = np.sum(everyone, axis=0).astype(np.float32)

# values, under jit
for dt in ("float32", "int32", "bfloat16", "float16"):
    xs = [data(q, (5,), dt) for q in range(n)]
    same(jax.jit(jax_ext.all_reduce)(jnp.asarray(xs[r])), np.sum(np.stack(xs).astype(np.float64), 0).astype(dt),
         f"all_reduce {dt}")
    same(jax.jit(lambda v: jax_ext.all_reduce(v, "max"))(jnp.asarray(xs[r])), np.max(np.stack(xs), 0),
         f"all_reduce max {dt}")
same(jax.jit(lambda v: jax_ext.all_gather(v))(mine), np.stack(everyone), "all_gather")
same(jax.jit(lambda v: jax_ext.all_gather(v, axis=1, tiled=True))(mine), np.concatenate(everyone, 1),
     "all_gather tiled axis 1")
blocks = [data(q, (2 * n, 3)) for q in range(n)]
same(jax.jit(lambda v: jax_ext.reduce_scatter(v, tiled=True))(jnp.asarray(blocks[r])),
     np.sum(blocks, 0)[2 * r:2 * r + 2].astype(np.float32), "reduce_scatter")
for root in range(n):
    same(jax.jit(lambda v, root=root: jax_ext.broadcast(v, root))(mine), everyone[root], f"broadcast root {root}")
a2a = [data(q, (n, 2)) for q in range(n)]
same(jax.jit(lambda v: jax_ext.all_to_all(v))(jnp.asarray(a2a[r])), np.stack([a2a[q][r] for q in range(n)]),
     "all_to_all")
ring = [(q, (q + 1) % n) for q in range(n)]
same(jax.jit(lambda v: jax_ext.ppermute(v, perm=ring))(mine), everyone[(r - 1) % n], "ppermute")
same(jax.jit(lambda v: jax_ext.sendrecv(v, source=(r - 1) % n, dest=(r + 1) % n))(mine), everyone[(r - 1) % n],
     "sendrecv")


def p2p(v):
    if r % 2 == 0 and r + 1 < n:
        jax_ext.send(v, r + 1, tag=3)
        return jax_ext.recv(v, r + 1, tag=4)
    if r % 2 == 1:
        got = jax_ext.recv(v, r - 1, tag=3)
        jax_ext.send(got * 2, r - 1, tag=4)
        return got
    return v


out = jax.jit(p2p)(mine)
if r % 2 == 0 and r + 1 < n:
    same(out, everyone[r] * 2, "send/recv reply")
elif r % 2 == 1:
    same(out, everyone[r - 1], "send/recv")
jax.jit(lambda: jax_ext.barrier())()

# in place: a donated input is the output buffer, the op runs on it without a copy
before = counts()["in_place"]
donated = jax.jit(jax_ext.all_reduce, donate_argnums=0)
same(donated(jnp.asarray(everyone[r])), total, "donated all_reduce")
assert counts()["in_place"] == before + 1, ("donated buffer was not aliased", counts())
checks += 1

# gradients (as mpi4jax and lax.psum under check_vma: the sum is one value every rank holds a copy of, so
# its cotangent comes back unchanged, not summed over the ranks again)
w = [data(q, (4, 3), salt=5) for q in range(n)]
g = jax.jit(jax.grad(lambda v: jnp.sum(jax_ext.all_reduce(v) * w[r])))(mine)
same(g, w[r], "grad all_reduce")
wg = [data(q, (n, 4, 3), salt=1) for q in range(n)]
g = jax.jit(jax.grad(lambda v: jnp.sum(jax_ext.all_gather(v) * wg[r])))(mine)
same(g, np.sum([wg[q][r] for q in range(n)], 0).astype(np.float32), "grad all_gather")
ws = [data(q, (2, 3), salt=2) for q in range(n)]
g = jax.jit(jax.grad(lambda v: jnp.sum(jax_ext.reduce_scatter(v, tiled=True) * ws[r])))(jnp.asarray(blocks[r]))
same(g, np.concatenate(ws).astype(np.float32), "grad reduce_scatter")
g = jax.jit(jax.grad(lambda v: jnp.sum(jax_ext.sendrecv(v, (r - 1) % n, (r + 1) % n) * w[r])))(mine)
same(g, w[(r + 1) % n], "grad sendrecv")
wa = [data(q, (n, 2), salt=3) for q in range(n)]
g = jax.jit(jax.grad(lambda v: jnp.sum(jax_ext.all_to_all(v) * wa[r])))(jnp.asarray(a2a[r]))
same(g, np.stack([wa[q][r] for q in range(n)]), "grad all_to_all")
# forward mode through send/recv: the tangent travels with the value
if n >= 2 and r < 2:
    def fwd(v):
        if r == 0:
            jax_ext.send(v * v, 1, tag=9)
            return v
        return jax_ext.recv(v, 0, tag=9)
    _, t = jax.jvp(fwd, (mine,), (jnp.ones_like(mine),))
    same(t, np.ones((4, 3), np.float32) if r == 0 else 2 * everyone[0], "jvp send/recv")
# vmap: a batch axis goes through as a batch
bx = jnp.stack([mine, mine * 2])
same(jax.jit(jax.vmap(jax_ext.all_reduce))(bx), np.stack([total, 2 * total]), "vmap all_reduce")
same(jax.jit(jax.vmap(lambda v: jax_ext.all_gather(v, tiled=True)))(bx),
     np.stack([np.concatenate(everyone), 2 * np.concatenate(everyone)]), "vmap all_gather")

# ordering: many independent collectives that XLA may schedule in any order; each rank makes some of
# them expensive to reach (a rank-dependent chain of matmuls), many times, never a deadlock or mismatch
m = jnp.asarray(np.eye(16, dtype=np.float32))


def many(vs):
    outs = []
    for i, v in enumerate(vs):
        if (i + r) % 3 == 0:
            for _ in range(4):
                v = (m @ v.reshape(16, -1)).reshape(v.shape)
        kind = i % 3
        outs.append(jax_ext.all_reduce(v) if kind == 0 else
                    jax_ext.all_gather(v, tiled=True) if kind == 1 else jax_ext.ppermute(v, perm=ring))
    return outs


vs = [jnp.asarray(data(r, (16 * (1 + i % 4),), salt=i)) for i in range(18)]
f = jax.jit(many)
want = None
for _ in range(int(os.environ.get("JAXW_ROUNDS", "30"))):
    got = [np.asarray(o) for o in f(vs)]
    if want is None:
        want = []
        for i in range(18):
            xs = [data(q, (16 * (1 + i % 4),), salt=i) for q in range(n)]
            want.append(np.sum(xs, 0).astype(np.float32) if i % 3 == 0 else np.concatenate(xs) if i % 3 == 1
                        else xs[(r - 1) % n])
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        same(a, b, f"ordering op {i}")

# misuse: clear errors at trace time, and the communicator stays usable afterwards
def expect(exc, fn, text):
    global checks
    try:
        fn()
    except exc as e:
        assert text in str(e), (text, str(e))
        checks += 1
        return
    raise AssertionError(f"no {exc.__name__} ({text})")


expect(NameError, lambda: jax.jit(lambda v: jax_ext.psum(v, "i"))(mine), "not bound")
if n >= 2:
    expect(ValueError, lambda: jax.jit(lambda v: jax_ext.reduce_scatter(v, tiled=True))(jnp.ones(n + 1)),
           "not a multiple")
expect(NotImplementedError, lambda: jax.grad(lambda v: jnp.sum(jax_ext.all_reduce(v, "max")))(mine),
       "no derivative")
if n >= 2:
    expect(NotImplementedError, lambda: jax.grad(lambda v: (jax_ext.send(v, (r + 1) % n), jnp.sum(v))[1])(mine),
           "sendrecv")
# mismatched shapes across ranks: OpMismatch on every rank (in the XLA error), not a hang
# (on one host's GPUs the device path finds it on the GPU: the communicator's next GPU op raises it, and the
# communicator's GPU ops stay failed, as NCCL's do after an asynchronous error; docs/gpu.md)
if n >= 2:
    shape = (3,) if r == 0 else (5,)
    gpu_runner = getattr(comm, "_gpu", None)
    device_path = gpu_runner is not None and gpu_runner.path.startswith("ipc")
    on = comm.split(0).wait() if device_path else comm  # the device path's failure stays on that communicator
    try:
        jax.jit(lambda v: jax_ext.all_reduce(v, comm=on))(jnp.ones(shape)).block_until_ready()
        if device_path:
            jax.jit(lambda v: jax_ext.all_reduce(v, comm=on))(mine).block_until_ready()
    except Exception as e:  # noqa: BLE001 - XLA wraps our error
        assert "OpMismatch" in str(e) or "mismatch" in str(e).lower(), str(e)
        checks += 1
    else:
        raise AssertionError("mismatched shapes went unnoticed")
    same(jax.jit(jax_ext.all_reduce)(mine), total, "all_reduce after a mismatch")
if os.environ.get("JAXW_COORD") and n >= 2:
    # the all_reduce's autodiff against lax.psum's in shard_map (check_vma on) over one device per process,
    # where the value downstream is the same on every rank (w, the cotangents): there lax's rule and ours agree
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((n,), ("i",))

    def on_mesh(fn):
        def body(v, t):  # t is replicated (invariant); as a tangent of varying v it must be cast varying
            out = fn(lambda u: jax.lax.psum(u, "i"), v[0], jax.lax.pcast(t, ("i",), to="varying"), t)
            missing = tuple(a for a in ("i",) if a not in jax.typeof(out).mat.varying)
            return (jax.lax.pcast(out, missing, to="varying") if missing else out)[None]
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i")))
        v_glob = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), xv[None])
        t_glob = jax.make_array_from_process_local_data(NamedSharding(mesh, P()), tv)
        return np.asarray(f(v_glob, t_glob).addressable_shards[0].data)[0]

    w_same = jnp.asarray(data(0, (3,), salt=5))  # the same on every rank
    xv, tv = data(r, (3,)), data(0, (3,), salt=2)  # x varies by rank; tangents/cotangents are shared
    autodiff = {  # (op, primal, tangent like the primal, cotangent like the output)
        "grad": lambda ar, v, t, c: jax.grad(lambda u: jnp.sum(ar(u) * w_same))(v),
        "vjp": lambda ar, v, t, c: jax.vjp(ar, v)[1](c)[0],
        "jvp": lambda ar, v, t, c: jax.jvp(ar, (v,), (t,))[1],
        "linear_transpose": lambda ar, v, t, c: jax.linear_transpose(ar, v)(c)[0],
        "chained grad": lambda ar, v, t, c: jax.grad(lambda u: jnp.sum(ar(u) * w_same) + jnp.sum(ar(u * 2)))(v),
    }
    for label, fn in autodiff.items():
        ours = jax.jit(lambda v, t, fn=fn: fn(jax_ext.all_reduce, v, t, t))(jnp.asarray(xv), jnp.asarray(tv))
        same(ours, on_mesh(fn), f"all_reduce {label} equals lax.psum's on a mesh")
print(f"JAXP OK {checks} on rank {r} of {n}", flush=True)
