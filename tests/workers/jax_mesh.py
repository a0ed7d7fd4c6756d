"""jax_ext against jax.lax inside shard_map: every op, values and gradients, bit for bit.

Run as a script. One process with ``JAXW_DEVICES`` CPU devices, or, with
``JAXW_COORD``/``JAXW_NPROC``/``JAXW_PID`` set, one of several processes joined
by ``jax.distributed`` (JAX's own CPU collectives over Gloo are the
reference). Prints ``JAXW OK <checks>`` on success, or the first difference.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={os.environ.get('JAXW_DEVICES', '4')}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if os.environ.get("JAXW_COORD"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(os.environ["JAXW_COORD"], int(os.environ["JAXW_NPROC"]), int(os.environ["JAXW_PID"]))

import jax_ext  # noqa: E402

lax = jax.lax
try:  # jax >= 0.12 refuses lax.ppermute over axes out of mesh order, the reference for ("y", "x") below
    jax.config.update("jax_raise_on_ppermute_sort_diff", False)
except AttributeError:
    pass
ALL = ("x", "y")
mesh = Mesh(np.array(jax.devices()).reshape(2, -1), ALL)
SIZES = {"x": 2, "y": len(jax.devices()) // 2}
checks = 0


def local(shape: tuple[int, ...], dtype: str = "float32", salt: int = 0) -> jax.Array:
    """Exact data, different on every device (small integers)."""
    idx = lax.axis_index(ALL)
    base = jnp.arange(int(np.prod(shape)), dtype=jnp.int32).reshape(shape)
    return ((base * 3 + idx * 7 + salt) % 23 - 11).astype(dtype)


def varying(v):
    missing = tuple(a for a in ALL if a not in jax.typeof(v).mat.varying)
    return lax.pcast(v, missing, to="varying") if missing else v


def run(body, label: str, times: int = 1) -> None:
    """``body()`` returns pairs (ours, lax's); each is compared on every device, bit for bit."""
    program([(body, label)], times)


def program(bodies, times: int = 1) -> None:
    """The bodies' pairs in one jitted program (each program compiled costs a fraction of a second of CPU:
    the ops of one axis share one), each pair named by its body's label for a difference."""
    labels: list[str] = []

    def wrapped(_):
        labels.clear()
        outs = []
        for body, label in bodies:
            pairs = body()
            labels.extend(f"{label} #{i}" for i in range(len(pairs)))
            outs += [varying(jnp.expand_dims(v, 0)) for pair in pairs for v in pair]
        return outs

    f = jax.jit(jax.shard_map(wrapped, mesh=mesh, in_specs=P(ALL), out_specs=P(ALL)))
    for _ in range(times):
        compare(f(jnp.zeros(len(jax.devices()))), labels)


def compare(outs, labels: list[str]) -> None:
    global checks
    for i in range(0, len(outs), 2):
        ours, ref = outs[i], outs[i + 1]
        for shard_a, shard_b in zip(ours.addressable_shards, ref.addressable_shards, strict=True):
            a, b = np.asarray(shard_a.data), np.asarray(shard_b.data)
            if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
                print(f"JAXW FAIL {labels[i // 2]} on {shard_a.device}: ours {a.dtype}{a.shape}\n{a}\n"
                      f"lax {b.dtype}{b.shape}\n{b}", flush=True)
                sys.exit(1)
            checks += 1


def grad_pair(ours, ref, shape, dtype="float32"):
    """Gradients of sum(op(v) * w) through ours and through lax's op, w exact and device-dependent."""

    def g(op):
        def loss(v):
            out = op(v)
            w = local(out.shape, dtype, salt=5)
            return jnp.sum(out * w)

        return jax.grad(loss)(local(shape, dtype))

    return g(ours), g(ref)


AXES = ["x", "y", ("x", "y"), ("y", "x")]


def size(a):
    return int(np.prod([SIZES[n] for n in (a if isinstance(a, tuple) else (a,))]))


for ax in AXES:  # one program per axis: its every op, gradient and vmap
    n = size(ax)
    bodies: list = []
    add = lambda body, label, bodies=bodies: bodies.append((body, label))  # noqa: E731
    for dt in ("float32", "int32", "bfloat16", "float64" if jax.config.jax_enable_x64 else "float16"):
        add(lambda ax=ax, dt=dt: [(jax_ext.psum(local((3, 5), dt), ax), lax.psum(local((3, 5), dt), ax)),
                                  (jax_ext.pmax(local((4,), dt), ax), lax.pmax(local((4,), dt), ax)),
                                  (jax_ext.pmin(local((), dt), ax), lax.pmin(local((), dt), ax))], f"reduce {ax} {dt}")
    add(lambda ax=ax: [(jax_ext.pmean(local((6,)), ax), lax.pmean(local((6,)), ax))], f"pmean {ax}")
    gathers = []
    for axis, tiled in [(0, False), (1, False), (2, False), (0, True), (1, True)]:
        gathers.append((axis, tiled))
    add(lambda ax=ax, gathers=gathers: [(jax_ext.all_gather(local((2, 3)), ax, axis=a, tiled=t),
                        lax.all_gather(local((2, 3)), ax, axis=a, tiled=t)) for a, t in gathers], f"all_gather {ax}")
    add(lambda ax=ax, n=n: [
        (jax_ext.psum_scatter(local((n, 3)), ax), lax.psum_scatter(local((n, 3)), ax)),
        (jax_ext.psum_scatter(local((3, n)), ax, scatter_dimension=1),
         lax.psum_scatter(local((3, n)), ax, scatter_dimension=1)),
        (jax_ext.psum_scatter(local((2 * n, 3)), ax, tiled=True), lax.psum_scatter(local((2 * n, 3)), ax, tiled=True)),
        (jax_ext.psum_scatter(local((3, 2 * n)), ax, scatter_dimension=1, tiled=True),
         lax.psum_scatter(local((3, 2 * n)), ax, scatter_dimension=1, tiled=True))], f"psum_scatter {ax}")
    perms = [[(i, (i + 1) % n) for i in range(n)], [(0, n - 1)], [(i, i) for i in range(n)]]
    add(lambda ax=ax, perms=perms: [(jax_ext.ppermute(local((3,)), ax, p), lax.ppermute(local((3,)), ax, p))
                                   for p in perms],
        f"ppermute {ax}")
    a2a = []
    for split, concat, tiled, shape in [(0, 0, False, (n, 3)), (0, 1, False, (n, 3)), (1, 0, False, (3, n)),
                                        (1, 1, False, (2, n)), (0, 0, True, (2 * n, 3)), (0, 1, True, (2 * n, 3)),
                                        (1, 0, True, (3, 2 * n)), (2, 1, True, (2, 3, n))]:
        a2a.append((split, concat, tiled, shape))
    add(lambda ax=ax, a2a=a2a: [(jax_ext.all_to_all(local(s), ax, sp, cc, tiled=t),
                        lax.all_to_all(local(s), ax, sp, cc, tiled=t)) for sp, cc, t, s in a2a], f"all_to_all {ax}")
    # gradients: every differentiable op, against lax's transpose rules
    add(lambda ax=ax, n=n: [
        grad_pair(lambda v: jax_ext.psum(v, ax), lambda v: lax.psum(v, ax), (3, 2)),
        grad_pair(lambda v: jax_ext.pmean(v, ax), lambda v: lax.pmean(v, ax), (4,)),
        grad_pair(lambda v: jax_ext.all_gather(v, ax, axis=1), lambda v: lax.all_gather(v, ax, axis=1), (2, 3)),
        grad_pair(lambda v: jax_ext.all_gather(v, ax, tiled=True), lambda v: lax.all_gather(v, ax, tiled=True), (2,)),
        grad_pair(lambda v: jax_ext.psum_scatter(v, ax, tiled=True), lambda v: lax.psum_scatter(v, ax, tiled=True),
                  (2 * n, 2)),
        grad_pair(lambda v: jax_ext.ppermute(v, ax, [(i, (i + 1) % n) for i in range(n)]),
                  lambda v: lax.ppermute(v, ax, [(i, (i + 1) % n) for i in range(n)]), (3,)),
        grad_pair(lambda v: jax_ext.all_to_all(v, ax, 0, 1, tiled=True),
                  lambda v: lax.all_to_all(v, ax, 0, 1, tiled=True), (2 * n, 3)),
    ], f"grad {ax}")
    # vmap inside shard_map (a positional batch axis)
    add(lambda ax=ax: [(jax.vmap(lambda v: jax_ext.psum(v, ax))(local((3, 2))),
                        jax.vmap(lambda v: lax.psum(v, ax))(local((3, 2)))),
                       (jax.vmap(lambda v: jax_ext.all_gather(v, ax, tiled=True), in_axes=1)(local((2, 3))),
                        jax.vmap(lambda v: lax.all_gather(v, ax, tiled=True), in_axes=1)(local((2, 3))))],
        f"vmap {ax}")
    program(bodies)

# loops and remat: collectives inside fori_loop and checkpoint
run(lambda: [(lax.fori_loop(0, 3, lambda i, v: varying(jax_ext.psum(v, "x") / 2), local((4,))),
              lax.fori_loop(0, 3, lambda i, v: varying(lax.psum(v, "x") / 2), local((4,)))),
             (jax.grad(lambda v: jnp.sum(jax.checkpoint(lambda u: jax_ext.psum(u * u, "y"))(v)))(local((3,))),
              jax.grad(lambda v: jnp.sum(jax.checkpoint(lambda u: lax.psum(u * u, "y"))(v)))(local((3,))))],
    "fori_loop + checkpoint")
# ordering stress: independent collectives over different axis groups, some behind a device-dependent amount
# of work, in one program run many times; each device's thread must issue them in program order (else the
# groups' sequence numbers cross and it deadlocks or mismatches)
def stress():
    pairs = []
    for i in range(12):
        ax = AXES[i % len(AXES)]
        v = local((8,), salt=i)
        w = v
        for _ in range(3 * (i % 3)):
            w = jnp.tanh(w) * 0 + w  # exact, but work XLA may want to schedule late
        pairs.append((jax_ext.psum(w, ax) if i % 2 else jax_ext.all_gather(w, ax, tiled=True),
                      lax.psum(v, ax) if i % 2 else lax.all_gather(v, ax, tiled=True)))
    return pairs


run(stress, "ordering stress", times=int(os.environ.get("JAXW_ROUNDS", "30")))
print(f"JAXW OK {checks}", flush=True)
jax_ext.shutdown()
