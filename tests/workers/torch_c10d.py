"""Under torchrun: every c10d op on backend "aioccl", checked element by element against Gloo (a group of
the same ranks) and against the exact expected values, for every dtype the two share.

Usage: torchrun --nproc-per-node N torch_c10d.py [conformance | cuda | timeout | killed]

``cuda``: the conformance run on CUDA tensors (a GPU machine: aioccl's GPU path through c10d), against
Gloo on the same CUDA tensors where Gloo takes them, else against Gloo on the same values in CPU tensors.
Prints "[rank r] c10d n=N: C checks, F failures" and exits 1 on any failure.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
          torch.uint8]
POISON = 99
DEVICE = "cpu"
checks = 0
failures: list[str] = []
gloo_on_cpu: set[str] = set()  # ops Gloo refused CUDA tensors for: compared with Gloo's CPU results


def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    global checks
    checks += 1
    got, want = got.cpu(), want.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        failures.append(f"{what}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}")


def values(rank: int, count: int, dtype: torch.dtype, small: bool = False) -> torch.Tensor:
    """Small integers, exact in every dtype and under every reduction of up to 4 ranks."""
    v = (torch.arange(count) * 3 + rank * 5) % (3 if small else 7) + 1
    return v.to(dtype).to(DEVICE)


def poison(count: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((count,), POISON).to(dtype).to(DEVICE)


def both(fn, name: str, gloo: dist.ProcessGroup, expected=None, gloo_cpu: bool = False) -> None:
    """Run ``fn(group)`` on aioccl and on Gloo; it returns tensors to compare pairwise. ``expected()``: the
    values to compare with where this torch's Gloo lacks the op altogether (torch 2.11's all_to_all).
    ``gloo_cpu``: Gloo gets CPU tensors whatever DEVICE is (where Gloo crashes on CUDA tensors instead of
    refusing them)."""
    global DEVICE
    mine = fn(None)
    try:
        if gloo_cpu and DEVICE != "cpu":
            raise RuntimeError("Gloo is given CPU tensors for this op: does not support CUDA here")
        theirs = fn(gloo)
    except RuntimeError as e:
        if DEVICE == "cpu" and (expected is None or "does not support" not in str(e)):
            raise
        gloo_on_cpu.add(name.split(" ")[0])
        prev, DEVICE = DEVICE, "cpu"
        try:
            theirs = fn(gloo)
        except RuntimeError as e2:
            if expected is None or "does not support" not in str(e2):
                raise
            theirs = expected()
        finally:
            DEVICE = prev
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        check(f"{name}[{i}] vs gloo", a, b)


def conformance() -> None:
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    count = 37
    for dt in DTYPES:
        for op, small in ((dist.ReduceOp.SUM, False), (dist.ReduceOp.PRODUCT, True), (dist.ReduceOp.MIN, False),
                          (dist.ReduceOp.MAX, False)):
            def all_reduce(g, op=op, small=small, dt=dt):
                x = values(r, count, dt, small)
                dist.all_reduce(x, op=op, group=g)
                return [x]
            both(all_reduce, f"all_reduce {dt} {op}", gloo)
            want = values(0, count, dt, small)
            for k in range(1, n):
                w = values(k, count, dt, small)
                want = {dist.ReduceOp.SUM: lambda a, b: a + b, dist.ReduceOp.PRODUCT: lambda a, b: a * b,
                        dist.ReduceOp.MIN: torch.minimum, dist.ReduceOp.MAX: torch.maximum}[op](want, w)
            got = values(r, count, dt, small)
            dist.all_reduce(got, op=op)
            check(f"all_reduce {dt} {op} exact", got, want)
        for root in range(n):
            def broadcast(g, root=root, dt=dt):
                x = values(r, count, dt) if r == root else poison(count, dt)
                dist.broadcast(x, root, group=g)
                return [x]
            both(broadcast, f"broadcast {dt} root {root}", gloo)

            def reduce(g, root=root, dt=dt):
                x = values(r, count, dt)
                dist.reduce(x, root, group=g)
                return [x] if r == root else []
            both(reduce, f"reduce {dt} root {root}", gloo)

            def gather(g, root=root, dt=dt):
                outs = [poison(count, dt) for _ in range(n)] if r == root else None
                dist.gather(values(r, count, dt), outs, dst=root, group=g)
                return outs or []
            both(gather, f"gather {dt} root {root}", gloo)

            def scatter(g, root=root, dt=dt):
                out = poison(count, dt)
                ins = [values(k, count, dt) for k in range(n)] if r == root else None
                dist.scatter(out, ins, src=root, group=g)
                return [out]
            both(scatter, f"scatter {dt} root {root}", gloo)

        def all_gather(g, dt=dt):
            outs = [poison(count, dt) for _ in range(n)]
            dist.all_gather(outs, values(r, count, dt), group=g)
            return outs
        both(all_gather, f"all_gather {dt}", gloo)

        def all_gather_into_tensor(g, dt=dt):
            out = poison(count * n, dt)
            dist.all_gather_into_tensor(out, values(r, count, dt), group=g)
            return [out]
        both(all_gather_into_tensor, f"all_gather_into_tensor {dt}", gloo)

        def reduce_scatter_tensor(g, dt=dt):
            out = poison(count, dt)
            dist.reduce_scatter_tensor(out, values(r, count * n, dt), group=g)
            return [out]
        both(reduce_scatter_tensor, f"reduce_scatter_tensor {dt}", gloo)

        def reduce_scatter(g, dt=dt):
            out = poison(count, dt)
            dist.reduce_scatter(out, [values(r + k, count, dt) for k in range(n)], group=g)
            return [out]
        both(reduce_scatter, f"reduce_scatter {dt}", gloo)

        def all_to_all_single(g, dt=dt):
            out = poison(count * n, dt)
            dist.all_to_all_single(out, values(r, count * n, dt), group=g)
            return [out]
        both(all_to_all_single, f"all_to_all_single {dt}", gloo)

        def all_to_all_uneven(g, dt=dt):
            sent = [r + k + 1 for k in range(n)]  # rank r sends r + k + 1 rows of 2 to rank k
            got = [k + r + 1 for k in range(n)]
            out = poison(sum(got) * 2, dt).reshape(-1, 2)
            dist.all_to_all_single(out, values(r, sum(sent) * 2, dt).reshape(-1, 2), got, sent, group=g)
            return [out]
        both(all_to_all_uneven, f"all_to_all_single uneven {dt}", gloo)

        def all_to_all(g, dt=dt):
            outs = [poison(5, dt) for k in range(n)]
            dist.all_to_all(outs, [values(r * 10 + k, 5, dt) for k in range(n)], group=g)
            return outs
        both(all_to_all, f"all_to_all {dt}", gloo,
             expected=lambda dt=dt: [values(k * 10 + r, 5, dt).cpu() for k in range(n)])

        def sparse_sum(g, dt=dt):
            # rank r holds entries at r, r+1 (overlapping its neighbours') and, on rank 1, none at all
            size, at = (7, 3), [] if r == 1 else [r % 7, (r + 1) % 7]
            vals = torch.stack([values(r * 10 + k, 3, dt) for k in range(len(at))]) if at else \
                torch.zeros((0, 3), dtype=dt)
            x = torch.sparse_coo_tensor(torch.tensor([at], dtype=torch.int64).reshape(1, -1), vals.cpu(), size,
                                        check_invariants=True)
            dist.all_reduce(x, group=g)
            return [x.to_dense()]
        if dt in (torch.float32, torch.float64, torch.int64):
            both(sparse_sum, f"all_reduce sparse {dt}", gloo)

        def gather_coalesced(g, dt=dt):
            # as many inputs as ranks, all of one shape: a transposed layout would pass any shape check
            lists = [[poison(3, dt) for _ in range(n)] for _ in range(n)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                dist.all_gather_coalesced(lists, [values(r * 10 + i, 3, dt) for i in range(n)], group=g)
            return [t for outs in lists for t in outs]
        # torch 2.11's Gloo crashes (SIGSEGV) in all_gather_coalesced on CUDA tensors: it gets CPU ones
        both(gather_coalesced, f"all_gather_coalesced {dt}", gloo, gloo_cpu=True)
        outs = [poison(k + 2, dt) for k in range(n)]  # uneven pieces (Gloo refuses them): against the values
        dist.all_to_all(outs, [values(r * 10 + k, r + 2, dt) for k in range(n)])
        for k in range(n):
            check(f"all_to_all uneven {dt} from {k}", outs[k], values(k * 10 + r, k + 2, dt))

    x = values(r, 8, torch.float32)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    check("all_reduce avg", x, sum(values(k, 8, torch.float32) for k in range(n)) / n)
    p2p(r, n, gloo)
    backend_api(r, n, gloo)
    coalesced(r, n)
    handles(r, n)
    objects(r, n)
    if n >= 3:
        sub = dist.new_group([0, 2])
        if r in (0, 2):
            y = values(r, 5, torch.int64)
            dist.all_reduce(y, group=sub)
            check("new_group [0, 2]", y, values(0, 5, torch.int64) + values(2, 5, torch.int64))
    dist.barrier()


def backend_api(r: int, n: int, gloo: dist.ProcessGroup) -> None:
    """What torch asks of a backend beyond the ops, answered as Gloo answers it: the backend per device, the
    default device, sequence numbers, and a group's monitored barrier (its errors in Gloo's words)."""
    from torch.distributed.distributed_c10d import _get_pg_default_device

    world = dist.group.WORLD
    check("_get_backend(cpu)", torch.tensor(world._get_backend(torch.device("cpu")) is not None), torch.tensor(True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "will be deprecated"
        check("_get_pg_default_device", torch.tensor(_get_pg_default_device().type == "cpu"), torch.tensor(True))
    for name, g in (("aioccl", world), ("gloo", gloo)):
        before = g._get_sequence_number_for_group()
        dist.all_reduce(torch.ones(1), group=g)
        check(f"{name} sequence number counts collectives", torch.tensor(g._get_sequence_number_for_group() - before),
              torch.tensor(1))
    backend = world._get_backend(torch.device(DEVICE))
    for what, op, seconds in (("SUM, torch's call", dist.ReduceOp.SUM, None), ("SUM, 30 s", dist.ReduceOp.SUM, 30),
                              ("MAX", dist.ReduceOp.MAX, None), ("SUM, no time", dist.ReduceOp.SUM, 0)):
        opts = dist.AllreduceOptions()  # what dist.all_reduce passes, and the options it never sets
        opts.reduceOp = op
        if seconds is not None:
            opts.timeout = timedelta(seconds=seconds)  # 0: none of its own, as torch's default (-1 ms) says
        x = values(r, 5, torch.int32)
        w = backend.allreduce([x], opts)
        assert w.wait() and w.result()[0] is x
        folded = values(0, 5, torch.int32)
        for j in range(1, n):
            folded = folded + values(j, 5, torch.int32) if op == dist.ReduceOp.SUM else torch.maximum(
                folded, values(j, 5, torch.int32))
        check(f"backend.allreduce {what}", x, folded)
        try:  # refused before anything is sent (aioccl's ValueError), and the group goes on
            backend.allreduce([values(r, 6, torch.float32)[::2]], opts)
        except ValueError as e:
            check(f"backend.allreduce {what}, every other element: {e}", torch.tensor("not contiguous" in str(e)),
                  torch.tensor(True))
        else:
            check(f"backend.allreduce {what}, every other element, refused", torch.tensor(False), torch.tensor(True))
    gloo.monitored_barrier(timedelta(seconds=30))  # every rank arrives (Gloo's failures leave it unusable: the
    for name, g in (("aioccl", world),):  # messages expected below are Gloo's, as torch's suite matches them)
        g.monitored_barrier(timedelta(seconds=30))
        if n >= 3:  # the last rank stays away: rank 0 names it, the others learn rank 0 gave up
            want = {0: f"Rank {n - 1} failed to pass monitoredBarrier", n - 1: None}.get(r, "successfully reached")
            if want is not None:
                check_raises(f"{name} monitored_barrier, rank {n - 1} away",
                             lambda g=g: g.monitored_barrier(timedelta(seconds=1)), want)
            dist.barrier(group=g)
        if r == 0:  # no time left: rank 0 fails at once, the others do not take part (as in torch's suite: last,
            # since the ranks' counts of monitored barriers now differ)
            check_raises(f"{name} monitored_barrier(0)", lambda g=g: g.monitored_barrier(timedelta(seconds=0)),
                         "Rank 0 timed out in monitoredBarrier")
        dist.barrier(group=g)


def check_raises(what: str, fn, pattern: str) -> None:
    global checks
    checks += 1
    try:
        fn()
    except RuntimeError as e:
        if not re.search(pattern, str(e)):
            failures.append(f"{what}: {e!r} does not match {pattern!r}")
        return
    failures.append(f"{what}: did not raise")


def p2p(r: int, n: int, gloo: dist.ProcessGroup) -> None:
    nxt, prv = (r + 1) % n, (r - 1) % n
    out = poison(11, torch.int32)
    ops = [dist.P2POp(dist.isend, values(r, 11, torch.int32), nxt, tag=3),
           dist.P2POp(dist.irecv, out, prv, tag=3)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("batch_isend_irecv", out, values(prv, 11, torch.int32))
    if r == 0:
        dist.send(values(0, 4, torch.float64), 1, tag=9)
    elif r == 1:
        t = poison(4, torch.float64)
        dist.recv(t, 0, tag=9)
        check("send/recv", t, values(0, 4, torch.float64))
    any_source(r, n, gloo)


def any_source(r: int, n: int, gloo: dist.ProcessGroup) -> None:
    """``dist.recv`` without ``src`` (receive from any source) returns the sender, as on Gloo: rank 0 takes
    one message from every other rank, in whatever order they come, with both backends."""
    global DEVICE
    got: dict[str, dict[int, torch.Tensor]] = {}
    device = DEVICE
    for name, g in (("aioccl", None), ("gloo", gloo)):
        # torch 2.11's Gloo aborts the process on a CUDA tensor's send here: Gloo gets CPU tensors
        DEVICE = device if g is None else "cpu"
        got[name] = {}
        for _ in range(n - 1 if r == 0 else 0):
            t = poison(6, torch.int64)
            src = dist.recv(t, group=g, tag=4)
            got[name][src] = t
        if r:
            dist.send(values(r, 6, torch.int64), 0, group=g, tag=4)
        dist.barrier(group=g)
    DEVICE = device
    if r == 0:
        check("recv any source: senders", torch.tensor(sorted(got["aioccl"])), torch.tensor(sorted(got["gloo"])))
        for src, t in got["gloo"].items():
            check(f"recv any source from {src} vs gloo", got["aioccl"].get(src, poison(6, torch.int64)), t)


def coalesced(r: int, n: int) -> None:
    """torch's coalescing manager: all_reduces (and all_gather_into_tensors) issued inside run as one."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    xs = [values(r + k, 20 + k, torch.float32) for k in range(3)]
    with _coalescing_manager(device=torch.device(DEVICE), async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x)
    cm.wait()
    for k, x in enumerate(xs):
        check(f"coalesced all_reduce {k}", x, sum(values(j + k, 20 + k, torch.float32) for j in range(n)))
    outs = [poison(4 * n, torch.int64) for _ in range(2)]
    with _coalescing_manager(device=torch.device(DEVICE)):
        for k, out in enumerate(outs):
            dist.all_gather_into_tensor(out, values(r + k, 4, torch.int64))
    for k, out in enumerate(outs):
        check(f"coalesced all_gather_into_tensor {k}", out, torch.cat([values(j + k, 4, torch.int64)
                                                                       for j in range(n)]))
    blocks = [poison(3, torch.int32) for _ in range(2)]
    with _coalescing_manager(device=torch.device(DEVICE)):
        for k, out in enumerate(blocks):
            dist.reduce_scatter_tensor(out, values(r + k, 3 * n, torch.int32))
    for k, out in enumerate(blocks):
        want = sum(values(j + k, 3 * n, torch.int32) for j in range(n))[3 * r:3 * r + 3]
        check(f"coalesced reduce_scatter_tensor {k}", out, want.to(torch.int32))
    lists = [[poison(2 + k, torch.float64) for k in range(2)] for _ in range(n)]  # [rank][input], as in torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated by torch, still a c10d op
        dist.all_gather_coalesced(lists, [values(r + k, 2 + k, torch.float64) for k in range(2)])
    for j, outs_j in enumerate(lists):
        for k in range(2):
            check(f"all_gather_coalesced {k} from {j}", outs_j[k], values(j + k, 2 + k, torch.float64))


def handles(r: int, n: int) -> None:
    for _ in range(50):  # wait() returned: the future is done too, at once (as on Gloo), whichever finishes first
        x = values(r, 64 * 1024, torch.float32)
        w = dist.all_reduce(x, async_op=True)
        fut = w.get_future()
        assert w.wait() is True
        assert fut.done(), "get_future() not done right after wait() returned"
        assert w.is_completed()
        check("future's value right after wait", fut.value()[0], x)
    x = values(r, 1000, torch.float32)
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    assert w.wait() is True
    got = fut.wait()
    check("async all_reduce future", got[0], sum(values(k, 1000, torch.float32) for k in range(n)))
    check("async all_reduce in place", x, got[0])
    assert w.is_completed()
    chained = dist.all_reduce(values(r, 3, torch.int64), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check("future then", chained.wait(), 2 * sum(values(k, 3, torch.int64) for k in range(n)))


def objects(r: int, n: int) -> None:
    got: list = [None] * n
    dist.all_gather_object(got, {"rank": r, "pad": "x" * r * 100})
    global checks
    checks += 1
    if got != [{"rank": k, "pad": "x" * k * 100} for k in range(n)]:
        failures.append(f"all_gather_object: {got}")
    objs = [f"hello from {r}", r] if r == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    checks += 1
    if objs != ["hello from 0", 0]:
        failures.append(f"broadcast_object_list: {objs}")


def silent_rank() -> None:
    """Rank n-1 never joins the all_reduce of a group made with a 2 s timeout: the others raise
    DistBackendError naming it, in time. (The default group keeps torch's timeout: bounded by 2 s too, its
    set-up failed on a loaded machine, where a rank can take longer than that to start.)"""
    n = dist.get_world_size()
    dist.barrier()  # every rank is here: the group's set-up does not wait for a slow start
    group = dist.new_group(timeout=timedelta(seconds=2))
    if dist.get_rank() == n - 1:
        time.sleep(6)
        return
    all_reduce_fails(f"ranks [{n - 1}]", 1.5, 6, group)


def killed_rank() -> None:
    """Rank n-1 is killed (SIGKILL) before the all_reduce: the others raise DistBackendError naming it."""
    n = dist.get_world_size()
    dist.barrier()
    if dist.get_rank() == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    all_reduce_fails(f"rank {n - 1}", 0, 10)


def all_reduce_fails(naming: str, low_s: float, high_s: float, group: Any = None) -> None:
    """An all_reduce raises DistBackendError whose message has ``naming``, within [low_s, high_s]."""
    global checks
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=group)
        failures.append("all_reduce returned without the missing rank")
    except dist.DistBackendError as e:
        took = time.monotonic() - t0
        checks += 1
        if naming not in str(e) or not low_s <= took < high_s:
            failures.append(f"error after {took:.1f}s: {e}")
        print(f"[rank {dist.get_rank()}] raised after {took:.1f}s: {str(e).splitlines()[0]}", flush=True)


def main() -> None:
    global DEVICE
    mode = sys.argv[1] if len(sys.argv) > 1 else "conformance"
    if mode == "cuda":
        DEVICE, mode = "cuda", "conformance"
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    import aioccl.interop.c10d  # registered by the entry point when installed; a checkout on PYTHONPATH is not

    aioccl.interop.c10d.register()
    dist.init_process_group(backend="aioccl")
    assert dist.get_backend() == "aioccl", dist.get_backend()
    {"conformance": conformance, "timeout": silent_rank, "killed": killed_rank}[mode]()
    r, n = dist.get_rank(), dist.get_world_size()
    print(f"[rank {r}] c10d n={n}: {checks} checks, {len(failures)} failures"
          + (f" on {DEVICE} tensors (Gloo refused CUDA for {sorted(gloo_on_cpu)})" if DEVICE != "cpu" else ""),
          flush=True)
    for f in failures[:10]:
        print(f"[rank {r}] FAIL {f}", flush=True)
    if mode == "conformance":
        dist.destroy_process_group()
    else:
        os._exit(1 if failures else 0)  # the silent rank's op is abandoned on purpose
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
