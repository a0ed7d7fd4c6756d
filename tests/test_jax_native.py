"""jax_ext's ops as native XLA custom calls (jax_ext/native_call.py, aioccl/native/src/py/xla_ffi.c).

Real processes under aioccl-run (tests/workers/jax_native.py): every collective learnt at its first
calls and then run in C, exact; a late rank (the engine carries the op on); an engine op in flight
first; a mismatch caught by type; and JAX's persistent compilation cache written by one run and hit by
the next. In-process: what a jitted op lowers to, with the native core and without.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import jax_ext
from jax_ext import native_call

from conftest import ROOT, TRANSPORT_ENV, launch

pytestmark = pytest.mark.skipif(native_call.why_not() is not None,
                                reason=f"no native custom calls here: {native_call.why_not()}")


@pytest.mark.parametrize("n", [2, 3])
def test_native_calls_exact_and_cached_across_runs(n: int, tmp_path: os.PathLike[str]) -> None:
    cache = str(tmp_path)
    env = TRANSPORT_ENV["shm"]
    first = launch(n, "jax_native.py", cache, env=env, timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    files = len(os.listdir(cache))
    assert files > 0, "nothing was written to the persistent compilation cache"
    second = launch(n, "jax_native.py", cache, env=env, timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    pattern = r"JAXNATIVE ok rank (\d+) native (\d+) cache_hits (\d+) cache_misses (\d+) cache_files (\d+)"
    lines = re.findall(pattern, second.stdout)
    assert len(lines) == n, second.stdout
    for rank, ran_native, hits, misses, now in lines:
        assert int(ran_native) > 60, (rank, ran_native)
        # (ranks compile programs of their own too, rank-dependent ones: the folder holds every rank's)
        assert int(hits) >= 10 and int(misses) == 0, f"rank {rank}: {hits} hits, {misses} misses"
        assert int(now) == files, "the second run compiled (and cached) again"


def _lowered(fn: object, x: object) -> str:
    return jax.jit(fn).lower(x).as_text()  # type: ignore[arg-type]


def test_a_jitted_op_lowers_to_its_own_custom_call() -> None:
    text = _lowered(lambda v: jax_ext.all_reduce(v), jnp.ones(4))
    assert "aioccl_all_reduce" in text and "site" in text, text
    assert "xla_buffer_python_cpu_callback" not in text, text


def test_without_the_native_core_it_lowers_to_a_host_callback() -> None:
    code = ("import jax, jax.numpy as jnp, jax_ext\n"
            "print(jax.jit(lambda v: jax_ext.all_reduce(v)).lower(jnp.ones(4)).as_text())\n"
            "print('WHY', jax_ext.native_call.why_not())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "AIOCCL_NATIVE": "0"})
    assert r.returncode == 0, r.stderr
    assert "xla_buffer_python_cpu_callback" in r.stdout and "aioccl_all_reduce" not in r.stdout, r.stdout
    assert "WHY the native core is not in use" in r.stdout, r.stdout


def test_error_cause_finds_nothing_in_other_errors() -> None:
    assert jax_ext.error_cause(RuntimeError("unrelated")) is None
    assert jax_ext.error_cause(RuntimeError("x [jax_ext error 999999]")) is None



def test_a_closed_communicator_refuses_a_jitted_op_answered_in_c() -> None:
    """A communicator of one rank answers its custom calls in C; once closed, its lane is off and the call
    goes to Python, which raises the communicator's error (kept for error_cause)."""
    import numpy as np

    import aioccl

    comm = aioccl.Communicator.create_sync(aioccl.UniqueId.new(host="127.0.0.1"), 0, 1)
    f = jax.jit(lambda v: jax_ext.all_reduce(v, comm=comm))
    before = native_call.stats()["native"]
    for _ in range(3):
        assert np.array_equal(np.asarray(f(jnp.arange(3.0))), np.arange(3.0))
    assert native_call.stats()["native"] >= before + 2
    comm.close().wait()
    with pytest.raises(Exception) as info:
        f(jnp.arange(3.0)).block_until_ready()
    assert isinstance(jax_ext.error_cause(info.value), aioccl.CommAborted), info.value


@pytest.mark.parametrize("n", [2, 3])
def test_point_to_point_calls_run_on_the_native_lane_exact(n: int) -> None:
    """sendrecv, send/recv and a large ppermute inside jitted code, in C after their first call (the lane,
    the engine borrowed from XLA's thread): every dtype and size exact, a late peer, a quiet FIFO."""
    # (a ppermute past the native core's size goes point-to-point rather than by a gather)
    done = launch(n, "jax_pair.py", env={**TRANSPORT_ENV["shm"], "AIOCCL_NATIVE_MAX_BYTES": "65536"}, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = re.findall(r"JAXPAIR ok rank (\d+) native (\d+) carried (\d+)", done.stdout)
    assert len(lines) == n, done.stdout + done.stderr
