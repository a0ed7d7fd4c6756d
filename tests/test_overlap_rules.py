"""Every op, every in/out relation, both transports: an op either gives the exact result or refuses.

docs/api.md's shape table says which overlaps of ``out`` and ``x`` are legal. Here each op runs on 3
ranks over real sockets and over shared memory with ``out`` as: ``x`` itself, another view of x's memory,
disjoint memory, x's own block, another block, and half of x shifted. A legal case must be accepted and
bit-exact (outputs poisoned first, every element checked); an illegal one must raise InvalidArgument on
the rank whose buffers break the rule, before anything is sent, and leave the communicator usable: that
rank then issues the op with a legal ``out`` and the others' results must still be exact.

Counts are above the 1 MiB shared-memory slot and the socket chunk, so the schedules run several chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aioccl

from conftest import close_all, make_comms

N = 3
ROOT = 1
COUNT = 300_000  # int32: 1.2 MB per rank, several chunks on either transport
POISON = -7


def data(r: int, count: int = COUNT) -> np.ndarray:
    return ((np.arange(count, dtype=np.int64) * 7 + r * 13) % 101).astype(np.int32)


def poison(a: np.ndarray) -> np.ndarray:
    a[...] = POISON
    return a


# out-candidates for ops whose output has x's shape: (x, out, legal); x's data is data(r)
def same_shape(case: str, r: int) -> tuple[np.ndarray, np.ndarray | None, bool]:
    if case == "itself":
        x = data(r)
        return x, x, True
    if case == "view":
        x = data(r)
        return x, x[:], True
    if case == "disjoint":
        return data(r), poison(np.empty(COUNT, np.int32)), True
    assert case == "half"
    buf = np.zeros(COUNT * 2, np.int32)
    x = buf[:COUNT]
    x[...] = data(r)
    return x, buf[COUNT // 2:COUNT // 2 + COUNT], False


# candidates for a block relation: the big buffer has N blocks of COUNT; the small one is a block
def blocks(case: str, small_is_x: bool, r: int, block: int) -> tuple[np.ndarray, np.ndarray, bool]:
    big = poison(np.empty(N * COUNT, np.int32)) if small_is_x else np.concatenate([data(100 * r + i)
                                                                                   for i in range(N)])
    if case == "disjoint":
        small = data(r) if small_is_x else poison(np.empty(COUNT, np.int32))
        legal = True
    else:
        start = {"own": block * COUNT, "other": ((block + 1) % N) * COUNT, "half": COUNT // 2}[case]
        small = big[start:start + COUNT]
        if small_is_x:
            small[...] = data(r)
        legal = case == "own"
    return (small, big, legal) if small_is_x else (big, small, legal)


def run(comms: list[aioccl.Communicator], issue: Callable[[aioccl.Communicator, int], tuple[Any, bool]],
        fallback: Callable[[aioccl.Communicator, int], Any]) -> tuple[list[Any], list[bool]]:
    works, refused = [], []
    for c in comms:
        try:
            w, legal = issue(c, c.rank)
        except aioccl.InvalidArgument as e:
            refused.append(True)
            works.append(("refused", str(e)))
            continue
        refused.append(False)
        works.append(w)
    # the communicator stays usable: a refusing rank issues the op again with a legal out
    for c in comms:
        if refused[c.rank]:
            works[c.rank] = ("fallback", fallback(c, c.rank))
    return works, refused


async def finish(works: list[Any]) -> list[Any]:
    out = []
    for w in works:
        out.append(await (w[1] if isinstance(w, tuple) else w))
    return out


SAME_SHAPE_CASES = ["itself", "view", "disjoint", "half"]
BLOCK_CASES = ["disjoint", "own", "other", "half"]


@pytest.fixture(params=["tcp", "shm"], scope="module")
def transport(request):
    return request.param


@pytest.mark.parametrize("case", SAME_SHAPE_CASES)
@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "reduce"])
async def test_same_shape_ops(transport, name, case):
    comms = await make_comms(N, transport=transport)
    try:
        bufs = [same_shape(case, r) for r in range(N)]
        want_sum = sum(data(r).astype(np.int64) for r in range(N)).astype(np.int32)
        want = {"all_reduce": want_sum, "reduce": want_sum, "broadcast": data(ROOT)}[name]

        def issue(c: aioccl.Communicator, r: int) -> tuple[Any, bool]:
            x, out, legal = bufs[r]
            args = {"root": ROOT} if name != "all_reduce" else {}
            return getattr(c, name)(x, out=out, **args), legal or (name == "reduce" and r != ROOT)

        fresh_out: dict[int, np.ndarray] = {}

        def fallback(c: aioccl.Communicator, r: int) -> Any:
            x = bufs[r][0]
            fresh_out[r] = poison(np.empty(COUNT, np.int32))
            args = {"root": ROOT} if name != "all_reduce" else {}
            return getattr(c, name)(x, out=fresh_out[r], **args)

        works, refused = run(comms, issue, fallback)
        results = await finish(works)
        for r in range(N):
            legal = bufs[r][2] or (name == "reduce" and r != ROOT)
            assert refused[r] == (not legal), (name, case, r, works[r])
            if name == "reduce" and r != ROOT:
                assert results[r] is None
                continue
            assert np.array_equal(results[r], want), (name, case, r)
    finally:
        await close_all(comms)


@pytest.mark.parametrize("case", BLOCK_CASES)
@pytest.mark.parametrize("name", ["all_gather", "gather", "reduce_scatter", "scatter"])
async def test_block_ops(transport, name, case):
    comms = await make_comms(N, transport=transport)
    try:
        rooted = name in ("gather", "scatter")
        small_is_x = name in ("all_gather", "gather")

        def make(r: int) -> tuple[np.ndarray | None, np.ndarray | None, bool]:
            block = ROOT if rooted else r
            if rooted and r != ROOT:  # non-roots: gather has no out, scatter no x
                return (data(r), None, True) if name == "gather" else (None, poison(np.empty(COUNT, np.int32)), True)
            return blocks(case, small_is_x, r, block)

        bufs = [make(r) for r in range(N)]
        if name == "all_gather" or name == "gather":
            want = [np.concatenate([data(r) for r in range(N)])] * N
        elif name == "reduce_scatter":
            total = sum(np.concatenate([data(100 * r + i) for i in range(N)]).astype(np.int64)
                        for r in range(N)).astype(np.int32)
            want = [total[r * COUNT:(r + 1) * COUNT] for r in range(N)]
        else:
            want = [data(100 * ROOT + r) for r in range(N)]

        def issue(c: aioccl.Communicator, r: int) -> tuple[Any, bool]:
            x, out, legal = bufs[r]
            args = {"root": ROOT} if rooted else {}
            return getattr(c, name)(x, out=out, **args), legal

        def fallback(c: aioccl.Communicator, r: int) -> Any:
            x, out, _ = bufs[r]
            args = {"root": ROOT} if rooted else {}
            if small_is_x:
                return getattr(c, name)(data(r), out=poison(np.empty(N * COUNT, np.int32)), **args)
            return getattr(c, name)(np.concatenate([data(100 * r + i) for i in range(N)]),
                                    out=poison(np.empty(COUNT, np.int32)), **args)

        works, refused = run(comms, issue, fallback)
        results = await finish(works)
        for r in range(N):
            assert refused[r] == (not bufs[r][2]), (name, case, r, works[r])
            if name == "gather" and r != ROOT:
                assert results[r] is None
                continue
            assert np.array_equal(results[r], want[r]), (name, case, r)
    finally:
        await close_all(comms)


@pytest.mark.parametrize("case", ["itself", "view", "disjoint", "half"])
async def test_all_to_all(transport, case):
    comms = await make_comms(N, transport=transport)
    try:
        xs = [np.concatenate([data(10 * r + j) for j in range(N)]) for r in range(N)]

        def issue(c: aioccl.Communicator, r: int) -> tuple[Any, bool]:
            x = xs[r]
            out = {"itself": x, "view": x[:], "disjoint": poison(np.empty_like(x))}.get(case)
            if case == "half":
                buf = np.zeros(2 * x.size, np.int32)
                buf[:x.size] = x
                x, out = buf[:x.size], buf[x.size // 2:x.size // 2 + x.size]
            return c.all_to_all(x, out=out), case == "disjoint"

        works, refused = run(comms, issue, lambda c, r: c.all_to_all(xs[r], out=poison(np.empty_like(xs[r]))))
        results = await finish(works)
        for r in range(N):
            assert refused[r] == (case != "disjoint"), (case, r, works[r])
            want = np.concatenate([data(10 * j + r) for j in range(N)])
            assert np.array_equal(results[r], want), (case, r)
    finally:
        await close_all(comms)
