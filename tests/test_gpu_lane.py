"""The GPU lane (aioccl/native/src/py/gpu_lane.c) against a stand-in CUDA driver that records every call.

No GPU here: ``tests/native/standin_cuda.c`` is built into a library that answers the driver calls the
lane makes and records them, so each test checks exactly what would reach the GPU, in what order, with
which kernel arguments and epochs: both forms, the event and the bounded window of ops in flight, the
checks that send a call the general way, driver errors, cross-stream ordering, and several threads issuing at once."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aioccl import native
from aioccl.group import current_group
from aioccl.native.answers import Declined
from aioccl.work import BORN_DONE_LOCK, Work

ROOT = Path(__file__).resolve().parent.parent
LAUNCH, WRITE, WAIT, RECORD, STREAM_WAIT, SYNC = range(1, 7)
NOT_READY = 600
pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.why_not}")


class Rec(ctypes.Structure):
    _fields_ = [("call", ctypes.c_int), ("handle", ctypes.c_void_p), ("stream", ctypes.c_void_p),
                ("addr", ctypes.c_ulonglong), ("value", ctypes.c_uint), ("grid", ctypes.c_uint),
                ("threads", ctypes.c_uint), ("args", ctypes.c_ulonglong * 24)]


def build_standin(cc: str, so: Path) -> None:
    build = subprocess.run([cc, "-std=gnu17", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-O1",
                            str(ROOT / "tests" / "native" / "standin_cuda.c"), "-o", str(so)],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr


def open_standin(so: Path) -> Any:
    """The stand-in driver, loaded as the lane's CUDA driver, and its test side."""
    native.core.load_cuda(str(so))
    lib = ctypes.CDLL(str(so))
    lib.standin_log.restype = ctypes.POINTER(Rec)
    lib.standin_context.argtypes = [ctypes.c_void_p]
    lib.standin_nargs(21)  # what launch_spec's kernels take
    return lib


_STANDIN: list[Any] = []  # built and loaded once per process: the lane's driver is the process's


def standin(tmp_path_factory: Any) -> Any:
    """The stand-in driver, loaded (test_xla_ffi_gpu.py takes it too: one per process, whoever asks first)."""
    if not _STANDIN:
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            pytest.skip("no C compiler on this machine")
        so = tmp_path_factory.mktemp("standin") / "libstandin_cuda.so"
        build_standin(cc, so)
        _STANDIN.append(open_standin(so))
    return _STANDIN[0]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: Any) -> Any:
    return standin(tmp_path_factory)


def run_all(driver: Any) -> int:
    """Every test here that takes the stand-in, each parameter too (tests/native/sanitized_module.py runs
    them in the module built with the sanitizers); how many ran."""
    ran = 0
    for name, fn in list(globals().items()):
        if not name.startswith("test_") or "driver" not in fn.__code__.co_varnames[:fn.__code__.co_argcount]:
            continue
        marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
        for value in (marks[0].args[1] if marks else [None]):
            fn(driver, value) if marks else fn(driver)
            ran += 1
    return ran


def calls(lib: Any) -> list[Rec]:
    n = lib.standin_count()
    log = lib.standin_log()
    out = [Rec.from_buffer_copy(log[k]) for k in range(n)]
    lib.standin_reset()
    return out


class Mem:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class FakeArray:
    """What the lane reads of a cupy array: ``data.ptr``, ``strides``, ``size``, ``dtype``."""

    def __init__(self, ptr: int, size: int, dtype: Any = np.float32, strides: tuple[int, ...] | None = None) -> None:
        self.data, self.size, self.dtype = Mem(ptr), size, np.dtype(dtype)
        self.strides = (self.dtype.itemsize,) if strides is None else strides


class Event:
    made = 0

    def __init__(self) -> None:
        Event.made += 1
        self.ptr = Event.made  # small integers: the stand-in's event table


ERR = (ctypes.c_uint32 * 8)()
FLAGS = (0x1000, 0x2000, 0x3000)  # ranks 0, 1, 2's flag words as mapped here
STREAM = 0x51


def make_lane(driver: Any, form: int, rank: int = 1, seq: int = 7) -> tuple[Any, list[Any]]:
    ERR[0] = 0
    recorded: list[Any] = []
    lane = native.core.GpuLane(Work, BORN_DONE_LOCK, None, threading.get_ident(), recorded.append, current_group,
                               FakeArray, lambda: STREAM, Event, ctypes.addressof(ERR), form, rank, FLAGS, 0x5EED, seq,
                               100)
    driver.standin_context(0x5EED)
    driver.standin_capturing(0)
    driver.standin_complete_all()
    calls(driver)
    return lane, recorded


def launch_spec(fn: int, nargs: int = 21, epoch_at: int = 19, grid: int = 4) -> tuple[Any, ...]:
    args = np.arange(100, 100 + nargs, dtype=np.uint64)  # argument k holds 100 + k
    args[epoch_at] = 0
    return (fn, grid, 512, args.tobytes(), epoch_at)


def test_a_stream_form_op_is_publish_flag_waits_consume_then_its_event(driver):
    lane, _ = make_lane(driver, form=1)
    plan = native.core.GpuPlan(((launch_spec(0xA), launch_spec(0xB)), (launch_spec(0xA), launch_spec(0xB))))
    ev = lane.enqueue(plan, STREAM, 7, 1, 5.0, ("x",), True)
    log = calls(driver)
    want = []
    for e in (101, 102):
        want += [(LAUNCH, 0xA, e), (WRITE, FLAGS[1], e), (WAIT, FLAGS[0], e), (WAIT, FLAGS[2], e), (LAUNCH, 0xB, e)]
    got = [(r.call, r.handle if r.call == LAUNCH else r.addr, r.args[19] if r.call == LAUNCH else r.value)
           for r in log[:-1]]
    assert got == want
    assert all(r.stream == STREAM for r in log)
    assert [a for a in log[0].args[:19]] == list(range(100, 119)) and log[0].args[20] == 120
    assert (log[-1].call, log[-1].handle, log[-1].stream) == (RECORD, ev.ptr, STREAM)
    assert lane.epoch == 102 and lane.tracked == 1
    assert lane.recent(101) == (7, 1, 5.0) and lane.recent(102) == (7, 1, 5.0) and lane.recent(99) is None


def test_a_spin_form_op_is_one_launch_per_piece_its_epoch_left_to_the_kernel(driver):
    lane, _ = make_lane(driver, form=0)
    plan = native.core.GpuPlan(((launch_spec(0xC),), (launch_spec(0xC),), (launch_spec(0xC),)))
    lane.enqueue(plan, STREAM, 7, 1, 5.0, None, True)
    log = calls(driver)
    assert [r.call for r in log] == [LAUNCH, LAUNCH, LAUNCH, RECORD]
    assert all(r.args[19] == 0 and r.grid == 4 and r.threads == 512 for r in log[:3])
    assert lane.epoch == 103


def test_an_untracked_op_records_no_event_and_a_new_stream_waits_for_the_last(driver):
    lane, _ = make_lane(driver, form=0)
    plan = native.core.GpuPlan(((launch_spec(0xC),),))
    assert lane.enqueue(plan, STREAM, 7, 1, 5.0, None, False) is None  # (a CUDA graph's capture)
    assert [r.call for r in calls(driver)] == [LAUNCH]
    first = lane.enqueue(plan, STREAM, 8, 1, 5.0, None, True)
    assert [r.call for r in calls(driver)] == [LAUNCH, RECORD]
    lane.enqueue(plan, 0x52, 9, 1, 5.0, None, True)  # another stream: ordered after the last op's event
    log = calls(driver)
    assert [(r.call, r.stream) for r in log] == [(STREAM_WAIT, 0x52), (LAUNCH, 0x52), (RECORD, 0x52)]
    assert log[0].handle == first.ptr  # (never the last stream itself: its owner may have destroyed it)
    lane.enqueue(plan, 0x52, 10, 1, 5.0, None, True)
    assert [r.call for r in calls(driver)] == [LAUNCH, RECORD]  # the same stream: in order already


def learn(lane: Any, x: FakeArray, plan: Any, out: Any = None, code: int = 1, op: Any = "sum") -> None:
    lane.learn(lane.key(code, x, out, op, 0, STREAM),
               (plan, "all_reduce", (x.size, x.dtype, op, None), code, 5.0, 0 if out is None else 1))
    lane.enabled = True


def test_run_takes_a_learnt_call_only_and_gives_a_done_work_with_its_event(driver):
    lane, recorded = make_lane(driver, form=1)
    plan = native.core.GpuPlan(((launch_spec(0xA), launch_spec(0xB)),))
    x = FakeArray(0xBEEF00, 16)
    assert isinstance(lane.run(1, x, None, "sum", 0), Declined)  # nothing learnt: the general way
    learn(lane, x, plan)
    assert isinstance(lane.run(1, FakeArray(0xBEEF40, 16), None, "sum", 0), Declined)  # another buffer
    assert isinstance(lane.run(1, x, None, "max", 0), Declined)  # another op
    # a strided view of it
    assert isinstance(lane.run(1, FakeArray(0xBEEF00, 16, strides=(8,)), None, "sum", 0), Declined)
    assert isinstance(lane.run(1, FakeArray(0xBEEF00, 16, np.int32), None, "sum", 0), Declined)  # another dtype
    learn(lane, x, plan, out=FakeArray(0xCAFE00, 16))
    # a smaller output at the same address
    assert isinstance(lane.run(1, x, FakeArray(0xCAFE00, 8), "sum", 0), Declined)
    assert isinstance(lane.run(1, np.zeros(16, np.float32), None, "sum", 0), Declined)  # not the GPU array type
    assert calls(driver) == []
    w = lane.run(1, x, None, "sum", 0)
    assert isinstance(w, Work) and w.done() and w.result() is x and w.seq == 7 and w.op == "all_reduce"
    assert w.event is not None and calls(driver)[-1].handle == w.event.ptr
    assert recorded[-1][:2] == ("all_reduce", 7) and recorded[-1][3] is None
    assert lane.run(1, x, None, "sum", 0).seq == 8 and lane.seq == 9 and lane.ran == 2


def test_run_gives_back_what_the_general_way_gave(driver):
    """x, out, or None (a rooted op's other ranks), as learnt; a learn with anything else is refused."""
    lane, _ = make_lane(driver, form=0)
    plan = native.core.GpuPlan(((launch_spec(0xC),),))
    x, out = FakeArray(0xBEEF00, 16), FakeArray(0xCAFE00, 16)
    for gives, code in ((0, 1), (1, 2), (2, 3)):
        lane.learn(lane.key(code, x, out, None, 0, STREAM), (plan, "reduce", (16, x.dtype, None, 0), code, 5.0, gives))
    lane.enabled = True
    for code, want in ((1, x), (2, out), (3, None)):
        w = lane.run(code, x, out, None, 0)
        assert w.done() and w.result() is want
    with pytest.raises(TypeError, match="gives"):
        lane.learn(lane.key(4, x, out, None, 0, STREAM), (plan, "reduce", (16, x.dtype, None, 0), 4, 5.0, 3))


@pytest.mark.parametrize("why", ["disabled", "context", "capturing", "error word", "group"])
def test_run_sends_the_call_the_general_way_when(driver, why):
    lane, _ = make_lane(driver, form=0)
    x = FakeArray(0xBEEF00, 16)
    learn(lane, x, native.core.GpuPlan(((launch_spec(0xC),),)))
    token = None
    if why == "disabled":
        lane.enabled = False
    elif why == "context":
        driver.standin_context(0x0DD)  # another device current on this thread
    elif why == "capturing":
        driver.standin_capturing(1)
    elif why == "error word":
        ERR[0] = 1  # a kernel gave up: the general way raises the failure
    else:
        token = current_group.set([])
    try:
        assert isinstance(lane.run(1, x, None, "sum", 0), Declined)
    finally:
        if token is not None:
            current_group.reset(token)
    assert [r.call for r in calls(driver)] == [] and lane.seq == 7


def test_a_driver_error_is_raised_naming_the_call_and_its_error(driver):
    lane, _ = make_lane(driver, form=1)
    plan = native.core.GpuPlan(((launch_spec(0xA), launch_spec(0xB)),))
    driver.standin_fail(2, 700)  # the flag write fails
    with pytest.raises(RuntimeError, match="cuStreamWriteValue32 failed: CUDA_ERROR_ILLEGAL_ADDRESS"):
        lane.enqueue(plan, STREAM, 7, 1, 5.0, None, True)
    driver.standin_fail(1, 999)
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed: CUresult 999"):
        lane.enqueue(plan, STREAM, 8, 1, 5.0, None, True)
    calls(driver)
    assert lane.oldest() is None  # the failed ops are not waited for


def test_the_ring_is_bounded_the_oldest_waited_for_and_free_events_reused(driver):
    lane, _ = make_lane(driver, form=0)
    plan = native.core.GpuPlan(((launch_spec(0xC),),))
    made = Event.made
    first = lane.enqueue(plan, STREAM, 0, 1, 5.0, None, True)
    assert lane.oldest()[:3] == (0, 1, 101)
    for k in range(1, 1024):
        lane.enqueue(plan, STREAM, k, 1, 5.0, None, True)
    assert lane.tracked == 1024 and Event.made == made + 1024
    calls(driver)
    lane.enqueue(plan, STREAM, 1024, 1, 5.0, None, True)  # full: waits for the oldest first
    log = calls(driver)
    assert log[0].call == SYNC and log[0].handle == first.ptr
    assert Event.made == made + 1025  # the first op's event is still held here (first): a new one
    driver.standin_complete_all()
    assert lane.oldest() is None and lane.tracked == 0
    del first
    ev = None
    for k in range(1025, 1025 + 1024):  # around the window again: every event free now, reused
        ev = lane.enqueue(plan, STREAM, k, 1, 5.0, None, True)
        del ev
    assert Event.made == made + 1025


def test_ops_from_several_threads_get_distinct_epochs_and_events(driver):
    lane, _ = make_lane(driver, form=1)
    plan = native.core.GpuPlan(((launch_spec(0xA), launch_spec(0xB)),))
    events: list[Any] = []

    def issue() -> None:
        for k in range(200):
            events.append(lane.enqueue(plan, STREAM, k, 1, 5.0, None, True))

    threads = [threading.Thread(target=issue) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log = calls(driver)
    pubs = [r.args[19] for r in log if r.call == LAUNCH and r.handle == 0xA]
    assert sorted(pubs) == list(range(101, 901)) and pubs == sorted(pubs)  # issue order is epoch order
    for k in range(0, len(log), 6):  # every op's five calls and its event, never interleaved
        e = log[k].args[19]
        assert [r.call for r in log[k:k + 6]] == [LAUNCH, WRITE, WAIT, WAIT, LAUNCH, RECORD]
        assert {log[k + 1].value, log[k + 2].value, log[k + 3].value, log[k + 4].args[19]} == {e}
    assert len({id(e) for e in events}) == 800


class FakeTensor:
    """What the lane reads of a torch tensor: ``data_ptr()``, ``stride()`` (in elements), ``numel()``,
    ``dtype`` and ``is_cuda``."""

    def __init__(self, ptr: int, n: int, dtype: str = "torch.float32", stride: tuple[int, ...] = (1,),
                 cuda: bool = True) -> None:
        self._ptr, self._n, self._stride, self.dtype, self.is_cuda = ptr, n, stride, dtype, cuda

    def data_ptr(self) -> int:
        return self._ptr

    def stride(self) -> tuple[int, ...]:
        return self._stride

    def numel(self) -> int:
        return self._n


def test_run_takes_torch_tensors_on_torchs_current_stream_once_told(driver):
    """take_tensors(type, stream_of_device, device): a learnt call on that type's tensors runs in C, on the
    stream stream_of_device(device) names (torch's current stream); the same checks as for GPU arrays."""
    lane, recorded = make_lane(driver, form=1)
    plan = native.core.GpuPlan(((launch_spec(0xA), launch_spec(0xB)),))
    t, asked = FakeTensor(0xBEEF00, 16), []
    assert isinstance(lane.run(1, t, None, "sum", 0), Declined)  # not a type the lane takes yet
    current = [STREAM]
    lane.take_tensors(FakeTensor, lambda dev: asked.append(dev) or current[0], 3)
    lane.learn(lane.key(1, t, None, "sum", 0, STREAM), (plan, "all_reduce", (16, "torch.float32", "sum", None), 1,
                                                       5.0, 0))
    lane.enabled = True
    assert isinstance(lane.run(1, FakeTensor(0xBEEF40, 16), None, "sum", 0), Declined)  # another buffer
    assert isinstance(lane.run(1, FakeTensor(0xBEEF00, 16, stride=(2,)), None, "sum", 0), Declined)  # strided
    # another dtype
    assert isinstance(lane.run(1, FakeTensor(0xBEEF00, 16, "torch.bfloat16"), None, "sum", 0), Declined)
    assert isinstance(lane.run(1, FakeTensor(0xBEEF00, 8), None, "sum", 0), Declined)  # fewer elements
    assert isinstance(lane.run(1, FakeTensor(0xBEEF00, 16, cuda=False), None, "sum", 0), Declined)  # a CPU tensor
    assert isinstance(lane.run(1, t, FakeArray(0xCAFE00, 16), "sum", 0), Declined)  # a tensor and a cupy array
    # a cupy array at the same address
    assert isinstance(lane.run(1, FakeArray(0xBEEF00, 16), None, "sum", 0), Declined)
    current[0] = STREAM + 1
    assert isinstance(lane.run(1, t, None, "sum", 0), Declined)  # torch's current stream is another one now
    assert calls(driver) == []
    current[0] = STREAM
    w = lane.run(1, t, None, "sum", 0)
    assert isinstance(w, Work) and w.done() and w.result() is t and w.seq == 7
    log = calls(driver)
    assert [r.call for r in log] == [LAUNCH, WRITE, WAIT, WAIT, LAUNCH, RECORD]
    assert {r.stream for r in log} == {STREAM} and log[-1].handle == w.event.ptr
    assert set(asked) == {3} and recorded[-1][:2] == ("all_reduce", 7)
    with pytest.raises(TypeError, match="callable"):
        lane.take_tensors(FakeTensor, 5, 3)


def test_a_closed_lane_launches_nothing_and_sends_calls_the_general_way(driver):
    """close() (the device path is about to free its memory): enqueue refuses, run() says "the general
    way", enabling it again is refused, and nothing reaches the driver."""
    lane, _ = make_lane(driver, form=1)
    plan = native.core.GpuPlan(((launch_spec(0xA), launch_spec(0xB)),))
    x = FakeArray(0xBEEF00, 16)
    learn(lane, x, plan)
    lane.close()
    assert not lane.enabled
    lane.enabled = True
    assert not lane.enabled
    assert isinstance(lane.run(1, x, None, "sum", 0), Declined)
    with pytest.raises(RuntimeError, match="closed"):
        lane.enqueue(plan, STREAM, 7, 1, 5.0, None, True)
    assert calls(driver) == [] and lane.oldest() is None


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="at least one piece"):
        native.core.GpuPlan(())
    with pytest.raises(ValueError, match="8-byte argument slots"):
        native.core.GpuPlan((((1, 4, 512, b"\0" * 12, 0),),))
    with pytest.raises(ValueError, match="the epoch's slot"):
        native.core.GpuPlan((((1, 4, 512, b"\0" * 16, 5),),))
    with pytest.raises(ValueError, match="same form"):
        native.core.GpuPlan((((1, 4, 512, b"\0" * 16, 0),), ((1, 4, 512, b"\0" * 16, 0), (1, 4, 512, b"\0" * 16, 0))))
