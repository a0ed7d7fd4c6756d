"""jax_ext's CUDA custom calls (aioccl/native/src/py/xla_ffi_gpu.c) driven with a synthetic XLA call frame.

No GPU and no XLA here: ``tests/native/ffi_frame.c`` builds the call frame XLA would hand the handler (a
stream from ``XLA_FFI_Stream_Get``, buffers, the mesh position, the site attribute) and the GPU lane runs
against the stand-in CUDA driver (``tests/native/standin_cuda.c``), which records what would reach the GPU.
A learnt call launches on XLA's stream with no Python run; everything else reaches the site's GPU fallback
with the addresses and sizes it needs; a bad attribute, a CPU site, a fallback's error come back as the
call's error text. tests/native/sanitized_module.py runs these under AddressSanitizer and UBSan too.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_gpu_lane import ERR, LAUNCH, RECORD, STREAM, calls, launch_spec, make_lane, standin

from aioccl import native

ROOT = Path(__file__).resolve().parent.parent
S32, S64 = 4, 5  # XLA_FFI_DataType
pytestmark = pytest.mark.skipif(native.core is None or not hasattr(native.core, "ffi_gpu_handlers"),
                                reason="the native core without XLA's FFI headers")


def build_frame(cc: str, so: Path) -> None:
    import jax.ffi

    build = subprocess.run([cc, "-std=gnu17", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-O1",
                            f"-I{jax.ffi.include_dir()}", str(ROOT / "tests" / "native" / "ffi_frame.c"), "-o",
                            str(so)], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr


@pytest.fixture(scope="module")
def driver(tmp_path_factory: Any) -> Any:
    return standin(tmp_path_factory)


@pytest.fixture(scope="module")
def frame(tmp_path_factory: Any) -> Any:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    so = tmp_path_factory.mktemp("frame") / "libffi_frame.so"
    build_frame(cc, so)
    return ctypes.CDLL(str(so))  # (CDLL: the GIL is released for the call, as on XLA's thread)


class Calls:
    """A handler's target: a site, its GPU handler's address, and what its fallbacks were called with."""

    def __init__(self, op: str = "all_reduce", members: int = 1, gpu: bool = True) -> None:
        from jax_ext import native_call

        core = native.core
        assert core is not None
        core.ffi_handlers(native_call.TARGETS)
        self.seen: list[tuple[Any, ...]] = []
        self.error: BaseException | None = None
        self.index = core.ffi_site(op, members, self.cpu, self.gpu if gpu else None)
        cap = core.ffi_gpu_handlers()[op]
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        self.handler = get(cap, None)

    def cpu(self, *args: Any) -> None:
        raise AssertionError("the CPU fallback of a GPU call")

    def gpu(self, stream: int, where: int, ins: list[tuple[int, int]], outs: list[tuple[int, int]]) -> None:
        self.seen.append((stream, where, ins, outs))
        if self.error is not None:
            raise self.error


def call(frame: Any, c: Calls, ins: list[Any], outs: list[Any], elems: int = 16, site: int | None = None,
         dtype: int = S64, pos: int = 0, handler: int | None = None, stream: int = STREAM) -> tuple[int, str]:
    n_in, n_out = len(ins), len(outs)
    msg = ctypes.create_string_buffer(4096)
    position = ctypes.c_int32(pos)
    rc = frame.ffi_frame_call(
        ctypes.c_void_p(handler or c.handler), ctypes.c_longlong(c.index if site is None else site), dtype,
        ctypes.c_void_p(stream), n_in, (ctypes.c_void_p * max(1, n_in))(*[ctypes.addressof(b) for b in ins]),
        (ctypes.c_int64 * max(1, n_in))(*[elems] * n_in), n_out,
        (ctypes.c_void_p * max(1, n_out))(*[ctypes.addressof(b) for b in outs]),
        (ctypes.c_int64 * max(1, n_out))(*[elems] * n_out), ctypes.byref(position), msg, 4096)
    return rc, msg.value.decode()


def buffers(n: int = 2) -> list[Any]:
    return [(ctypes.c_float * 16)() for _ in range(n)]


def teach(c: Calls, lane: Any, x: Any, out: Any, plan: Any, nbytes: int = 64, pos: int = 0,
          stream: int = STREAM) -> None:
    native.core.ffi_gpu_learn(c.index, pos, lane, (ctypes.addressof(x), ctypes.addressof(out), nbytes, nbytes, stream),
                              (plan, "all_reduce", (16, "float32", "sum", None), 1, 5.0))


def test_a_learnt_call_launches_on_xlas_stream_without_python(driver, frame):
    lane, recorded = make_lane(driver, form=1)
    lane.enabled = True
    c = Calls()
    x, out = buffers()
    teach(c, lane, x, out, native.core.GpuPlan(((launch_spec(0xA), launch_spec(0xB)),)))
    before = native.core.ffi_stats()["native"]
    asks = frame.ffi_frame_stream_asks()
    assert call(frame, c, [x], [out]) == (0, "")
    log = calls(driver)
    assert [r.call for r in log][0] == LAUNCH and log[-1].call == RECORD and {r.stream for r in log} == {STREAM}
    assert c.seen == [] and lane.seq == 8 and lane.ran == 1 and recorded[-1][:2] == ("all_reduce", 7)
    assert native.core.ffi_stats()["native"] == before + 1 and frame.ffi_frame_stream_asks() == asks + 1
    assert call(frame, c, [x], [out]) == (0, "") and lane.seq == 9  # and again: the next sequence number


def test_anything_not_learnt_goes_to_the_gpu_fallback_with_addresses_and_sizes(driver, frame):
    lane, _ = make_lane(driver, form=0)
    lane.enabled = True
    c = Calls()
    x, out = buffers()
    other = buffers(1)[0]
    teach(c, lane, x, out, native.core.GpuPlan(((launch_spec(0xC),),)))
    assert call(frame, c, [other], [out]) == (0, "")  # another input buffer
    assert call(frame, c, [x], [out], elems=8) == (0, "")  # a size other than the learnt one
    ERR[0] = 1  # a kernel gave up: the general way raises it
    assert call(frame, c, [x], [out]) == (0, "")
    ERR[0] = 0
    lane.enabled = False  # the communicator closed or shrank
    assert call(frame, c, [x], [out]) == (0, "")
    assert calls(driver) == [] and lane.seq == 7
    a, o = ctypes.addressof(x), ctypes.addressof(out)
    assert [s[2:] for s in c.seen] == [([(ctypes.addressof(other), 64)], [(o, 64)]), ([(a, 32)], [(o, 32)]),
                                       ([(a, 64)], [(o, 64)]), ([(a, 64)], [(o, 64)])]
    assert {s[0] for s in c.seen} == {STREAM} and all(s[1] != 0 for s in c.seen)


def test_a_site_of_several_members_launches_the_member_that_learnt_the_stream(driver, frame):
    """A mesh-level site (a communicator per position): the fallback reads the position (device memory); a
    call some member learnt is launched through that member's lane, found by XLA's stream, since a stream
    belongs to one device, the member's (the position operand is not read)."""
    lanes = [make_lane(driver, form=1)[0] for _ in range(2)]
    for lane in lanes:
        lane.enabled = True
    c = Calls(members=4)
    x, out = buffers()
    assert call(frame, c, [x], [out], pos=3) == (0, "") and len(c.seen) == 1 and calls(driver) == []
    plan = native.core.GpuPlan(((launch_spec(0xA), launch_spec(0xB)),))
    teach(c, lanes[0], x, out, plan, pos=1, stream=STREAM)  # positions 1 and 3 live here, on two devices
    teach(c, lanes[1], x, out, plan, pos=3, stream=STREAM + 1)
    assert call(frame, c, [x], [out], pos=3, stream=STREAM + 1) == (0, "")
    assert {r.stream for r in calls(driver)} == {STREAM + 1} and (lanes[0].ran, lanes[1].ran) == (0, 1)
    assert call(frame, c, [x], [out], pos=1) == (0, "")
    assert {r.stream for r in calls(driver)} == {STREAM} and (lanes[0].ran, lanes[1].ran) == (1, 1)
    assert call(frame, c, [x], [out], pos=3, stream=STREAM + 2) == (0, "")  # a stream nobody learnt
    assert calls(driver) == [] and len(c.seen) == 2 and c.seen[-1][0] == STREAM + 2


def test_bad_frames_and_failing_fallbacks_are_the_calls_errors(driver, frame):
    make_lane(driver, form=0)
    c = Calls()
    x, out = buffers()
    rc, msg = call(frame, c, [x], [out], dtype=S32)  # the attribute of another type: no site
    assert rc == -1 and "names no site" in msg
    rc, msg = call(frame, c, [x], [out], site=1 << 40)
    assert rc == -1 and "names no site" in msg
    other = Calls("broadcast")
    rc, msg = call(frame, c, [x], [out], handler=other.handler)  # another op's handler
    assert rc == -1 and "names no site" in msg
    cpu = Calls(gpu=False)
    rc, msg = call(frame, cpu, [x], [out])
    assert rc == -1 and "lowered for the CPU" in msg
    c.error = ValueError("all_reduce: XLA's input holds 32 bytes, the op takes 64")
    rc, msg = call(frame, c, [x], [out], elems=8)
    assert rc == -1 and msg == "ValueError: all_reduce: XLA's input holds 32 bytes, the op takes 64"
    assert calls(driver) == []


def test_what_a_member_learns_is_checked(driver):
    lane, _ = make_lane(driver, form=0)
    c = Calls()
    plan = native.core.GpuPlan(((launch_spec(0xC),),))
    learn = native.core.ffi_gpu_learn
    with pytest.raises(ValueError, match="pos in range"):
        learn(c.index, 1, lane, (1, 2, 3, 4, 5), (plan, "all_reduce", None, 1, 5.0))
    with pytest.raises(ValueError, match="five integers"):
        learn(c.index, 0, lane, (1, 2, 3, 4, "s"), (plan, "all_reduce", None, 1, 5.0))
    with pytest.raises(ValueError, match="kind: int"):
        learn(c.index, 0, lane, (1, 2, 3, 4, 5), ("plan", "all_reduce", None, 1, 5.0))
    learn(c.index, 0, lane, (1, 2, 3, 4, 5), (plan, "all_reduce", None, 1, 5.0))
    other, _ = make_lane(driver, form=0)
    with pytest.raises(ValueError, match="another GPU lane"):
        learn(c.index, 0, other, (1, 2, 3, 4, 5), (plan, "all_reduce", None, 1, 5.0))


def run_all(driver: Any, frame: Any) -> int:
    """Every test here that takes only the stand-in and the frame, for tests/native/sanitized_module.py (the
    end-to-end one runs workers of its own); how many ran."""
    given = {"driver": driver, "frame": frame}
    ran = 0
    for name, fn in list(globals().items()):
        args = fn.__code__.co_varnames[:fn.__code__.co_argcount] if name.startswith("test_") else ("-",)
        if set(args) <= set(given):
            fn(*[given[a] for a in args])
            ran += 1
    return ran



def test_end_to_end_on_the_stand_in_gpu_the_first_call_teaches_the_rest(frame, tmp_path_factory):
    """tests/workers/jax_gpu_calls.py at 2 ranks: the handler's fallback runs the first call on views of the
    buffers and teaches the handler, which launches every later one through the GPU lane; exact every time,
    in place, into another buffer, and on a mesh-level site of a member per rank."""
    from test_gpu_lane_bridge import bridge_env

    from conftest import launch

    out = launch(2, "jax_gpu_calls.py", frame._name, "6", timeout=240, env=bridge_env(tmp_path_factory))
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    for r in range(2):
        assert re.search(rf"GPU_CALLS OK rank={r} checks=18 native=(14|15) python=(4|3)", text), text[-3000:]
    assert "never freed at exit" not in text, text[-3000:]


def test_the_cuda_custom_call_is_switched_on_by_name_only(monkeypatch):
    """Off by default (not measured under XLA on a GPU yet): jax_ext's GPU ops keep XLA's buffer callback."""
    from jax_ext import native_call

    monkeypatch.delenv("AIOCCL_JAX_GPU_NATIVE", raising=False)
    assert "AIOCCL_JAX_GPU_NATIVE is off" in native_call.why_not("cuda")
    monkeypatch.setenv("AIOCCL_JAX_GPU_NATIVE", "1")
    assert native_call.why_not("cuda") is None and native_call.why_not("cpu") is None
    assert native_call.why_not("rocm") == "no native custom calls on rocm"
