"""Compile CUDA source for a given architecture with NVRTC (the ``nvidia-cuda-nvrtc`` wheel), no GPU needed."""

from __future__ import annotations

import ctypes
import glob
import os


def _lib() -> ctypes.CDLL | None:
    try:
        import nvidia  # the namespace package the wheels install into
    except ImportError:
        return None
    for root in list(nvidia.__path__):
        for path in sorted(glob.glob(os.path.join(root, "cu*", "lib", "libnvrtc.so.*"))
                           + glob.glob(os.path.join(root, "cuda_nvrtc", "lib", "libnvrtc.so.*"))):
            if "builtins" not in path:
                return ctypes.CDLL(path)
    return None


LIB = _lib()


def compile_cubin(source: str, arch: str = "sm_90", name: str = "aioccl.cu") -> tuple[bytes, str]:
    """(cubin, log); raises RuntimeError with NVRTC's log when the source does not compile."""
    assert LIB is not None, "nvidia-cuda-nvrtc is not installed"
    prog = ctypes.c_void_p()
    rc = LIB.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    assert rc == 0, f"nvrtcCreateProgram: {rc}"
    opts = [f"-arch={arch}".encode(), b"-std=c++17"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    try:
        rc = LIB.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        LIB.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        LIB.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc != 0:
            raise RuntimeError(f"NVRTC failed ({rc}):\n{log}")
        LIB.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        LIB.nvrtcGetCUBIN(prog, cubin)
        return cubin.raw, log
    finally:
        LIB.nvrtcDestroyProgram(ctypes.byref(prog))
