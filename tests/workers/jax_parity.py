"""mpi4jax's behaviours, checked on jax_ext with real processes (run under aioccl-run, 2 or 3 ranks).

Part 1 is a matrix: every process-level op that moves values, under eager,
jit, vmap, jvp, vjp, grad, linear_transpose, jacfwd and jacrev, each against
a numpy expectation or against the op itself in a Python loop (vmap: one
example at a time; jacfwd: one jvp per basis tangent; jacrev: one vjp per
basis cotangent). Part 2 is what mpi4jax's suite checks beyond that:
scalars, the matvec transposes, custom_vjp, a CG solve, send/recv order,
status, barrier order, bad sizes. Data are small integers, so every
comparison is exact. Prints ``JAXPAR OK <checks>``; any failure exits 1.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.sparse.linalg import cg

import jax_ext

comm = jax_ext.default_comm()
r, n = comm.rank, comm.world_size
checks = 0


def data(rank: int, shape: tuple[int, ...], salt: int = 0) -> np.ndarray:
    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    return ((base * 3 + rank * 7 + salt) % 11 - 5).astype(np.float32)


def same(got, want, label: str) -> None:
    global checks
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        print(f"JAXPAR FAIL {label} on rank {r}: got {got.dtype}{got.shape}\n{got}\nwant {want.dtype}{want.shape}\n"
              f"{want}", flush=True)
        sys.exit(1)
    checks += 1


def raises(exc: type[BaseException], fn: Callable[[], object], text: str, label: str) -> None:
    global checks
    try:
        fn()
    except exc as e:
        if text not in str(e):
            print(f"JAXPAR FAIL {label} on rank {r}: {exc.__name__} without {text!r}: {e}", flush=True)
            sys.exit(1)
        checks += 1
        return
    print(f"JAXPAR FAIL {label} on rank {r}: no {exc.__name__}", flush=True)
    sys.exit(1)


# -- part 1: the matrix --------------------------------------------------------------------------------
S = (2,)  # per-rank shape: small, so the jacobian loops stay short
ROOT = 0


class Case:
    """One linear op: ``f`` on this rank, its input shape here, and numpy's forward and transpose."""

    def __init__(self, name: str, f: Callable, shape: Callable[[int], tuple[int, ...]],
                 forward: Callable[[list[np.ndarray], int], np.ndarray],
                 transpose: Callable[[list[np.ndarray], int], np.ndarray], jac: str = "both", mult: int = 1) -> None:
        self.name, self.f, self.shape, self.forward, self.transpose, self.jac = name, f, shape, forward, transpose, jac
        self.mult = mult  # every value a multiple of this: divisions by n stay exact (XLA divides by reciprocal)


def everyone(salt: int, shape_of: Callable[[int], tuple[int, ...]], mult: int = 1) -> list[np.ndarray]:
    return [data(q, shape_of(q), salt) * mult for q in range(n)]


ring_src, ring_dst = (r - 1) % n, (r + 1) % n
CASES = [
    Case("all_reduce sum", jax_ext.all_reduce, lambda q: S,
         lambda xs, q: np.sum(xs, 0), lambda cts, q: cts[q]),
    Case("all_reduce avg", lambda v: jax_ext.all_reduce(v, "avg"), lambda q: S,
         lambda xs, q: np.sum(xs, 0) / n, lambda cts, q: cts[q] / n, mult=n),
    Case("all_gather", jax_ext.all_gather, lambda q: S,
         lambda xs, q: np.stack(xs), lambda cts, q: np.sum([c[q] for c in cts], 0)),
    Case("reduce_scatter", lambda v: jax_ext.reduce_scatter(v, tiled=True), lambda q: (n * 2,),
         lambda xs, q: np.sum(xs, 0)[2 * q:2 * q + 2], lambda cts, q: np.concatenate(cts)),
    Case("all_to_all", jax_ext.all_to_all, lambda q: (n, 2),
         lambda xs, q: np.stack([x[q] for x in xs]), lambda cts, q: np.stack([c[q] for c in cts])),
    Case("ppermute", lambda v: jax_ext.ppermute(v, perm=[(q, (q + 1) % n) for q in range(n)]), lambda q: S,
         lambda xs, q: xs[(q - 1) % n], lambda cts, q: cts[(q + 1) % n]),
    Case("sendrecv", lambda v: jax_ext.sendrecv(v, ring_src, ring_dst), lambda q: S,
         lambda xs, q: xs[(q - 1) % n], lambda cts, q: cts[(q + 1) % n]),
    Case("broadcast", lambda v: jax_ext.broadcast(v, ROOT), lambda q: S,
         lambda xs, q: xs[ROOT], lambda cts, q: np.sum(cts, 0) if q == ROOT else np.zeros(S, np.float32)),
    Case("reduce", lambda v: jax_ext.reduce(v, "sum", ROOT), lambda q: S,
         lambda xs, q: np.sum(xs, 0) if q == ROOT else xs[q],
         lambda cts, q: cts[ROOT] if q == ROOT else cts[ROOT] + cts[q]),
    Case("scan", jax_ext.scan, lambda q: S,
         lambda xs, q: np.sum(xs[:q + 1], 0), lambda cts, q: np.sum(cts[q:], 0)),
    # the root's output (gather) or input (scatter) is n times the others': the basis of jacrev (gather) or
    # jacfwd (scatter) would differ in size across ranks, so only the other one runs
    Case("gather", lambda v: jax_ext.gather(v, ROOT), lambda q: S,
         lambda xs, q: np.stack(xs) if q == ROOT else xs[q],
         lambda cts, q: cts[ROOT][q] if q == ROOT else cts[ROOT][q] + cts[q], jac="fwd"),
    Case("scatter", lambda v: jax_ext.scatter(v, ROOT), lambda q: (n, 2) if q == ROOT else S,
         lambda xs, q: xs[ROOT][q], lambda cts, q: np.stack(cts) if q == ROOT else np.zeros(S, np.float32),
         jac="rev"),
]


def out_shape(case: Case, q: int) -> tuple[int, ...]:
    return case.forward(everyone(0, case.shape), q).shape


def basis(shape: tuple[int, ...]) -> list[np.ndarray]:
    out = []
    for i in range(int(np.prod(shape))):
        e = np.zeros(int(np.prod(shape)), np.float32)
        e[i] = 1
        out.append(e.reshape(shape))
    return out


def check(case: Case) -> None:
    """Every transformation of one op, against numpy or against the op one call at a time."""
    f, name = case.f, case.name
    xs = everyone(1, case.shape, case.mult)
    ts = everyone(2, case.shape, case.mult)
    cts = [data(q, out_shape(case, q), 3) * case.mult for q in range(n)]
    x, t, ct = jnp.asarray(xs[r]), jnp.asarray(ts[r]), jnp.asarray(cts[r])
    want = case.forward(xs, r)
    before = np.asarray(x).copy()
    same(f(x), want, f"{name} eager")
    same(x, before, f"{name} leaves its input alone")
    same(jax.jit(f)(x), want, f"{name} jit")
    # vmap: a batch of 3 against the op one example at a time
    batch = jnp.asarray(np.stack([data(r, case.shape(r), 10 + k) * case.mult for k in range(3)]))
    loop = np.stack([np.asarray(f(batch[k])) for k in range(3)])
    same(jax.vmap(f)(batch), loop, f"{name} vmap")
    same(jax.jit(jax.vmap(f))(batch), loop, f"{name} jit(vmap)")
    # forward mode: linear, so the tangent is the op of the tangent
    p, tan = jax.jvp(f, (x,), (t,))
    same(p, want, f"{name} jvp primal")
    same(tan, case.forward(ts, r), f"{name} jvp tangent")
    p, tan = jax.jit(lambda a, b: jax.jvp(f, (a,), (b,)))(x, t)
    same(tan, case.forward(ts, r), f"{name} jit(jvp)")
    # reverse mode, four ways
    g_want = case.transpose(cts, r).astype(np.float32)
    p, pull = jax.vjp(f, x)
    same(pull(ct)[0], g_want, f"{name} vjp")
    same(jax.jit(lambda a, c: jax.vjp(f, a)[1](c)[0])(x, ct), g_want, f"{name} jit(vjp)")
    same(jax.linear_transpose(f, x)(ct)[0], g_want, f"{name} linear_transpose")
    same(jax.grad(lambda a: jnp.sum(f(a) * ct))(x), g_want, f"{name} grad")
    same(jax.jit(jax.grad(lambda a: jnp.sum(f(a) * ct)))(x), g_want, f"{name} jit(grad)")
    # jacobians: a batched jvp / vjp against one call per basis vector
    if case.jac in ("both", "fwd"):
        cols = [np.asarray(jax.jvp(f, (x,), (jnp.asarray(e),))[1]) for e in basis(x.shape)]
        same(jax.jacfwd(f)(x), np.stack(cols, -1).reshape(want.shape + x.shape), f"{name} jacfwd")
    if case.jac in ("both", "rev"):
        rows = [np.asarray(jax.vjp(f, x)[1](jnp.asarray(e))[0]) for e in basis(want.shape)]
        same(jax.jacrev(f)(x), np.stack(rows).reshape(want.shape + x.shape), f"{name} jacrev")


for case in CASES:
    check(case)

# the transpose of the transpose is the op again (mpi4jax's transpose2), and linear_transpose under jit
ones = jnp.ones((3, 2))
lt = lambda y: jax.linear_transpose(lambda v: jax_ext.all_reduce(v), ones)(y)[0]  # noqa: E731
same(jax.linear_transpose(lt, ones)(ones)[0], np.full((3, 2), n, np.float32), "all_reduce transposed twice")
same(jax.jit(lambda y: jax.linear_transpose(lt, ones)(y)[0])(ones), np.full((3, 2), n, np.float32),
     "jit(all_reduce transposed twice)")
same(jax.jit(lt)(ones), np.ones((3, 2), np.float32), "jit(all_reduce transposed)")
# chained uses: grad of two all_reduces of the same input is 2, not 2n (mpi4jax's chained test)
same(jax.grad(lambda v: jax_ext.all_reduce(v) + jax_ext.all_reduce(v))(0.0), np.float32(2), "chained grad")
same(jax.jit(jax.grad(lambda v: jax_ext.all_reduce(v) + jax_ext.all_reduce(v)))(0.0), np.float32(2),
     "chained jit(grad)")


def unused_then_used(v):
    y = jax_ext.all_reduce(v)
    _ = v + 2 * y  # noqa: F841 - an all_reduce whose result is unused must still run on every rank
    return jax_ext.all_reduce(v).sum()


val, g = jax.jit(jax.value_and_grad(unused_then_used))(ones)
same(val, np.float32(6 * n), "value_and_grad value")
same(g, np.ones((3, 2), np.float32), "value_and_grad grad")
# vmap of a sendrecv whose received shape differs from the sent one (the static shape gets the batch axis)
like = jnp.zeros(3)
bx = jnp.asarray(np.stack([data(r, (3,), k) for k in range(4)]))
same(jax.vmap(lambda v: jax_ext.sendrecv(v, ring_src, ring_dst, like=like))(bx),
     np.stack([data(ring_src, (3,), k) for k in range(4)]), "vmap sendrecv with like=")
same(jax.eval_shape(jax.vmap(lambda v: jax_ext.sendrecv(v, ring_src, ring_dst)), jax.ShapeDtypeStruct((3, 2),
     jnp.float32)).shape, np.array((3, 2)), "vmap sendrecv's shape")
print(f"JAXPAR matrix done on rank {r}", flush=True)

# -- part 2: the rest of mpi4jax's suite ---------------------------------------------------------------
# scalars, eager and under jit, for every op that takes one
for how, call in (("eager", lambda fn, v: fn(v)), ("jit", lambda fn, v: jax.jit(fn)(v))):
    same(call(jax_ext.all_reduce, 1), np.int32(n), f"all_reduce of 1 {how}")
    same(call(jax_ext.all_gather, r), np.arange(n, dtype=np.int32), f"all_gather of a scalar {how}")
    same(call(lambda v: jax_ext.broadcast(v, 0), 1 if r == 0 else 0), np.int32(1), f"broadcast scalar {how}")
    same(call(lambda v: jax_ext.gather(v, 0), r), np.arange(n, dtype=np.int32) if r == 0 else np.int32(r),
         f"gather scalar {how}")
    same(call(lambda v: jax_ext.reduce(v, "sum", 0), r), np.int32(sum(range(n)) if r == 0 else r),
         f"reduce scalar {how}")
    same(call(jax_ext.scan, r), np.int32(sum(range(r + 1))), f"scan scalar {how}")
    same(call(lambda v: jax_ext.sendrecv(v, ring_src, ring_dst), r), np.int32(ring_src), f"sendrecv scalar {how}")
    if r == 0:
        for q in range(1, n):
            same(call(lambda v, q=q: jax_ext.recv(v, q, tag=q), 0), np.int32(q), f"recv scalar {how}")
    else:
        call(lambda v: (jax_ext.send(v, 0, tag=r), v)[1], r)
# scan with every op, and arrays of several shapes
for op, fold in (("sum", np.add), ("prod", np.multiply), ("max", np.maximum), ("min", np.minimum)):
    xs = [data(q, (3, 2)) for q in range(n)]
    acc = xs[0]
    for q in range(1, r + 1):
        acc = fold(acc, xs[q])
    same(jax.jit(lambda v, op=op: jax_ext.scan(v, op))(jnp.asarray(xs[r])), acc, f"scan {op}")
same(jax_ext.scan(jnp.asarray(data(r, (4,))), "avg"), np.sum([data(q, (4,)) for q in range(r + 1)], 0) / (r + 1),
     "scan avg")
# mpi4jax's matvec: A's columns spread over the ranks, x too; A x is an all_reduce, A^T y its transpose
m, cols = 5, 4 * n
A = data(9, (m, cols))
xg, yg, vg, vp = data(1, (cols,)), data(2, (m,)), data(3, (cols,)), data(4, (m,))
lo, hi = 4 * r, 4 * r + 4
A_l, x_l, v_l = jnp.asarray(A[:, lo:hi]), jnp.asarray(xg[lo:hi]), jnp.asarray(vg[lo:hi])
Ax, ATy, Av, ATvp = A @ xg, (A.T @ yg)[lo:hi], A @ vg, (A.T @ vp)[lo:hi]


def mv(v):
    return jax_ext.all_reduce(A_l @ v)


def transpose(fn, at):
    return lambda y: jax.linear_transpose(fn, at)(y)[0]


def mvT(y):
    return A_l.T @ transpose(jax_ext.all_reduce, jnp.asarray(yg))(y)


y_ = jnp.asarray(yg)
for how, wrap in (("", lambda fn: fn), ("jit ", jax.jit)):
    same(wrap(mv)(x_l), Ax, f"{how}matvec")
    same(wrap(mvT)(y_), ATy, f"{how}matvecT")
    same(wrap(transpose(mv, x_l))(y_), ATy, f"{how}matvec transposed")
    same(wrap(transpose(mvT, y_))(x_l), Ax, f"{how}matvecT transposed")
    same(wrap(transpose(transpose(mv, x_l), y_))(x_l), Ax, f"{how}matvec transposed twice")
    same(wrap(transpose(transpose(transpose(mv, x_l), y_), x_l))(y_), ATy, f"{how}matvec transposed thrice")
    same(wrap(lambda a, b: jax.jvp(mv, (a,), (b,))[1])(x_l, v_l), Av, f"{how}matvec jvp")
    same(wrap(lambda a, b: jax.jvp(mvT, (a,), (b,))[1])(y_, jnp.asarray(vp)), ATvp, f"{how}matvecT jvp")
    same(wrap(lambda a, b: jax.vjp(mv, a)[1](b)[0])(x_l, jnp.asarray(vp)), ATvp, f"{how}matvec vjp")
    same(wrap(lambda a, b: jax.vjp(mvT, a)[1](b)[0])(y_, v_l), Av, f"{how}matvecT vjp")
# a CG solve whose operator is an all_reduce (mpi4jax's custom linear solver): n x = b
b = jnp.asarray(data(5, (8,)))
op = jax.tree_util.Partial(jax_ext.all_reduce)
for how, solve in (("eager", cg), ("jit", jax.jit(cg))):
    sol, _ = solve(op, b)
    same(np.allclose(n * np.asarray(sol), np.asarray(b), atol=1e-5), np.True_, f"cg {how}")


# custom_vjp with an all_reduce in the rule, and a grad inside a custom_vjp rule (netket's expect)
@jax.custom_vjp
def fcv(x, y):
    return jax_ext.all_reduce((jnp.sin(x) * y).sum())


def fcv_fwd(x, y):
    return fcv(x, y), (jnp.cos(x), jnp.sin(x), y)


def fcv_bwd(res, g):
    g = jax_ext.all_reduce(g)
    cos_x, sin_x, y = res
    return cos_x * g * y, sin_x * g


fcv.defvjp(fcv_fwd, fcv_bwd)
gx = jax.jit(jax.grad(fcv))(jnp.zeros(3), jnp.ones(3) * 2)
same(gx, np.full(3, 2 * n, np.float32), "custom_vjp grad")


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def expect(log_pdf, w, x):
    return jax_ext.all_reduce(jnp.mean(log_pdf(w, x))) / n


def expect_fwd(log_pdf, w, x):
    return expect(log_pdf, w, x), (w, x)


def expect_bwd(log_pdf, res, g):
    w, x = res
    _, pull = jax.vjp(lambda w_: jax_ext.all_reduce(jnp.mean(log_pdf(w_, x))) / n, w)
    return pull(g)[0], jnp.zeros_like(x)


expect.defvjp(expect_fwd, expect_bwd)
w0, xs0 = jnp.asarray(data(0, (4, 2))), jnp.asarray(data(r, (6, 4)))
val, pull = jax.vjp(lambda w: expect(lambda w_, x_: jnp.sum(x_ @ w_, -1), w, xs0), w0)
want_g = data(r, (6, 4)).mean(0)[:, None].repeat(2, 1) / n  # the all_reduce's cotangent comes back as is
same(np.allclose(pull(jnp.ones_like(val))[0], want_g, rtol=1e-6), np.True_, "grad inside a custom_vjp rule")

if n >= 2 and r < 2:
    # send then receive on one rank, receive then send on the other, in one jitted function (token order)
    @jax.jit
    def crossed(v):
        if r == 0:
            jax_ext.send(v, 1)
            return jax_ext.recv(v, 1)
        got = jax_ext.recv(v, 0)
        jax_ext.send(v, 0)
        return got

    same(crossed(jnp.ones(10) * r), np.ones(10, np.float32) * (1 - r), "send/recv crossed under jit")
    # vmap of send and recv: a batch goes through as one message, equal to the examples one by one
    rows = jnp.asarray(np.stack([data(0, (3,), k) for k in range(4)]))
    if r == 0:
        jax.vmap(lambda v: jax_ext.send(v, 1, tag=5))(rows)
        for k in range(4):
            jax_ext.send(rows[k], 1, tag=5)
    else:
        got = jax.vmap(lambda v: jax_ext.recv(v, 0, tag=5))(jnp.zeros((4, 3)))
        same(got, np.stack([np.asarray(jax_ext.recv(jnp.zeros(3), 0, tag=5)) for _ in range(4)]), "vmap recv")
    # status, eager and under jit
    other = 1 - r
    for how, call in (("eager", lambda fn, v: fn(v)), ("jit", lambda fn, v: jax.jit(fn)(v))):
        st = jax_ext.Status()
        got = call(lambda v, st=st: jax_ext.sendrecv(v, other, other, tag=4, status=st), jnp.ones((3, 2)) * r)
        got.block_until_ready()
        same(got, np.ones((3, 2), np.float32) * other, f"sendrecv status {how} value")
        same((st.source, st.tag, st.count, st.nbytes), np.array((other, 4, 6, 24)), f"sendrecv status {how}")
        if r == 0:
            st = jax_ext.Status()
            got = call(lambda v, st=st: jax_ext.recv(v, 1, tag=6, status=st), jnp.zeros(5))
            got.block_until_ready()
            same((st.source, st.tag, st.count), np.array((1, 6, 5)), f"recv status {how}")
        else:
            call(lambda v: (jax_ext.send(v, 0, tag=6), v)[1], jnp.ones(5)).block_until_ready()
    # receive from any source with any tag (mpi4jax's defaults): status names the message's sender and tag
    for how, call in (("eager", lambda fn, v: fn(v)), ("jit", lambda fn, v: jax.jit(fn)(v))):
        if r == 0:
            st = jax_ext.Status()
            got = call(lambda v, st=st: jax_ext.recv(v, status=st), jnp.zeros(4))
            got.block_until_ready()
            same(got, np.arange(4, dtype=np.float32) + 7, f"recv any source {how} value")
            same((st.source, st.tag, st.count), np.array((1, 11, 4)), f"recv any source {how} status")
        else:
            call(lambda v: (jax_ext.send(v, 0, tag=11), v)[1], jnp.arange(4.0) + 7).block_until_ready()
    # one failed eager receive leaves nothing behind for a later, unrelated one
    if r == 0:
        jax_ext.send(jnp.arange(5.0), 1, tag=8)
        jax_ext.send(jnp.arange(3.0) + 100, 1, tag=8)
    else:
        try:
            jax_ext.recv(jnp.zeros(3), 0, tag=8).block_until_ready()  # 5 elements were sent: refused
        except Exception as e:  # noqa: BLE001 - XLA wraps our error
            same("5" in str(e) and "3" in str(e), np.True_, "a receive of the wrong size says both sizes")
        else:
            raise AssertionError("a 5-element message went into a 3-element receive")
        same(jax_ext.recv(jnp.zeros(3), 0, tag=8), np.arange(3.0, dtype=np.float32) + 100,
             "the receive after a failed one gets the next message")
# barrier: every rank's "start" line lands before any rank's "done" line
log = os.environ["JAXPAR_LOG"]
time.sleep(0.1 * r)
with open(log, "a") as fh:
    fh.write(f"r{r} start\n")
jax_ext.barrier()
jax.effects_barrier()
time.sleep(0.1 * r)
with open(log, "a") as fh:
    fh.write(f"r{r} done\n")
jax_ext.barrier()
jax.effects_barrier()
with open(log) as fh:
    lines = fh.read().split()
same(np.array([ln for ln in lines if ln in ("start", "done")]),
     np.array(["start"] * n + ["done"] * n), "barrier orders the lines")
# consecutive transposes around an all_to_all give the same under jit as eagerly (mpi4jax#176)
N = 6 * n
big = jnp.asarray(data(r, (N // n, N)))


def transposed(a):
    a = a.reshape(N // n, n, N // n).transpose(1, 0, 2)
    a = jax_ext.all_to_all(a)
    return a.reshape(N, N // n).T


same(jax.jit(transposed)(big), transposed(big), "all_to_all between transposes, jit vs eager")
# bad sizes: clear errors before anything is sent, and everything still works afterwards
raises(ValueError, lambda: jax_ext.all_to_all(jnp.ones(n + 1)), "must have size", "all_to_all of a wrong size")
if r == 0:
    raises(ValueError, lambda: jax_ext.scatter(jnp.ones(n + 1), 0), "must have shape (nproc, ...)",
           "scatter of a wrong size")
same(jax_ext.all_reduce(jnp.ones(2)), np.full(2, n, np.float32), "all_reduce after the refusals")
print(f"JAXPAR OK {checks} on rank {r} of {n}", flush=True)
