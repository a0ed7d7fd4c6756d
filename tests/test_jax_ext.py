"""jax_ext: aioccl collectives inside jitted JAX code.

The heavy checks run in real processes (tests/workers/jax_mesh.py and
jax_process.py: every op against jax.lax or numpy, values and gradients bit
for bit); this file launches them in every configuration and tests the
trace-time errors and helpers in-process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aioccl
import jax_ext
from jax_ext.runtime import group_layout

from conftest import ROOT, TRANSPORT_ENV, WORKERS, launch, reserved_port


def _run_procs(script: str, nproc: int, env: dict[str, str], timeout: float = 240) -> list[str]:
    """``nproc`` copies of a worker joined by jax.distributed; returns each one's output."""
    reservation = reserved_port()  # held until the workers are done: nothing else can take it meanwhile
    port = reservation.port
    procs = []
    for pid in range(nproc):
        penv = {**os.environ, "PYTHONPATH": str(ROOT), "JAXW_COORD": f"127.0.0.1:{port}", "JAXW_NPROC": str(nproc),
                "JAXW_PID": str(pid), **env}
        procs.append(subprocess.Popen([sys.executable, str(WORKERS / script)], env=penv, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
            assert p.returncode == 0, out[-4000:]
    finally:
        for p in procs:
            p.kill()
        reservation.close()
    return outs


# XLA's log line when a shard_map body holding an ordered effect was inlined with control dependences
# (see _compat.MeshCollectiveEffect); on jax 0.11/0.12 it preceded a crash
SIMPLIFIER_LOOP = "circular simplification loop"


@pytest.mark.parametrize("mode", ["aioccl", "xla"])
def test_mesh_ops_one_process_four_devices(mode: str) -> None:
    """Every mesh-level op, gradient, vmap, loop and remat equals jax.lax on a 2x2 mesh in one process: run by
    aioccl (``AIOCCL_JAX_MESH=aioccl``) and as XLA's own collectives (the default, jax_ext/in_process.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAXW_DEVICES": "4", "AIOCCL_JAX_MESH": mode}
    r = subprocess.run([sys.executable, str(WORKERS / "jax_mesh.py")], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0 and "JAXW OK 2120" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]
    assert SIMPLIFIER_LOOP not in r.stderr, r.stderr[-4000:]


def test_shard_map_whose_body_takes_no_arrays_compiles_cleanly() -> None:
    """The trigger of the jax 0.11/0.12 crash: a shard_map with no array inputs (only the effect's token
    would enter it) holding jax_ext.all_to_all beside lax.all_to_all. Exact, no crash, no loop log."""
    code = """if True:
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, jax.numpy as jnp, numpy as np
        import jax_ext
        mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
        def body(_):
            v = (jnp.arange(6).reshape(2, 3) + 10 * jax.lax.axis_index(("x", "y"))).astype(jnp.float32)
            return [jnp.expand_dims(o, 0) for o in (jax_ext.all_to_all(v, "x", 0, 0),
                                                     jax.lax.all_to_all(v, "x", 0, 0))]
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=jax.P(("x", "y")), out_specs=jax.P(("x", "y"))))
        for _ in range(3):
            ours, ref = f(jnp.zeros(4))
            assert np.array_equal(np.asarray(ours), np.asarray(ref)), (ours, ref)
        print("SHARDMAP OK")
        """
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SHARDMAP OK" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    assert SIMPLIFIER_LOOP not in r.stderr, r.stderr[-4000:]


def test_jax_version_parsing_takes_each_components_leading_digits() -> None:
    from jax_ext._compat import _version

    assert _version("0.4.61+cuda110") == (0, 4, 61)
    assert _version("0.4.61a1") == (0, 4, 61)
    assert _version("0.12.0.1") == (0, 12, 0)
    assert _version("0.5.dev20250101") == (0, 5, 0)
    assert _version("1") == (1, 0, 0)
    assert _version("0.10.2rc1") == (0, 10, 2)


def test_mesh_ops_two_processes_two_devices_each() -> None:
    """The same against JAX's own cross-process CPU collectives (Gloo): 2 processes x 2 devices."""
    outs = _run_procs("jax_mesh.py", 2, {"JAXW_DEVICES": "2"})
    assert all("JAXW OK 1060" in o and SIMPLIFIER_LOOP not in o for o in outs), outs


@pytest.mark.parametrize("n", [1, 2, 3])
def test_process_level_ops_under_aioccl_run(n: int) -> None:
    """One device per process, default communicator from aioccl-run's environment."""
    r = launch(n, "jax_process.py")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert r.stdout.count("JAXP OK") == n, r.stdout[-2000:]


@pytest.mark.parametrize(("transport", "widen"), [("shm", False), ("tcp", False), ("tcp", True)])
def test_an_interrupted_op_never_writes_into_freed_memory(transport: str, widen: bool) -> None:
    """KeyboardInterrupt at random points around jitted ops (inside the host callback too, where XLA then
    frees the op's buffers): the op finishes on buffers of its own or is waited for, the peer's results stay
    exact, and the communicator stays in step (tests/workers/jax_interrupt.py). Before: SIGSEGV or heap
    corruption; then, rarely, a write into freed memory (an interrupt inside the hand-over to a helper
    thread) or a hang (one inside the op's issue, or before a handed-on native op was taken on): ``widen``
    makes the hand-over's windows 5 ms wide."""
    env = {**TRANSPORT_ENV[transport], "JAXI_WIDEN": "1" if widen else "0"}
    try:
        r = launch(2, "jax_interrupt.py", env=env, timeout=180)
    except subprocess.TimeoutExpired as e:  # the ranks' stacks (the worker dumps them at 120 s) and last words
        raise AssertionError(f"hung: {_text(e.stdout)[-4000:]}{_text(e.stderr)[-12000:]}") from e
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    if "JAXI SKIP" in r.stdout:  # jax before 0.12 runs them on its own threads, which no signal interrupts
        pytest.skip(r.stdout.split("JAXI SKIP", 1)[1].splitlines()[0].strip())
    # per rank: ops, interrupted, inside, handover, carried, late (tests/workers/jax_interrupt.py)
    oks = [[int(v) for v in line.split("JAXI OK", 1)[1].split()] for line in r.stdout.splitlines() if "JAXI OK" in line]
    assert len(oks) == 2 and all(o[0] == 40 for o in oks), r.stdout[-2000:]
    if widen:  # rank 0's interrupts: some landed in the hand-over itself
        assert max(o[3] for o in oks) > 0, r.stdout[-2000:]
    if transport == "shm" and oks[0][4] != -1:  # the native core's ops handed on, interrupted on the way in
        assert max(o[5] for o in oks) > 0, r.stdout[-2000:]


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else b or ""


def test_process_level_ops_under_jax_distributed() -> None:
    """The default communicator's unique id travels through jax.distributed's key-value store."""
    outs = _run_procs("jax_process.py", 2, {})
    assert all("JAXP OK" in o for o in outs), outs


# -- in-process: trace-time errors and helpers -------------------------------------------------------------
def test_mesh_op_outside_shard_map_is_a_name_error() -> None:
    with pytest.raises(NameError, match="not bound.*shard_map"):
        jax.jit(lambda v: jax_ext.psum(v, "data"))(jnp.ones(3))


def test_unknown_axis_name_is_a_name_error() -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    f = jax.shard_map(lambda v: jax_ext.psum(v, "model"), mesh=mesh, in_specs=jax.P("data"), out_specs=jax.P())
    with pytest.raises(NameError, match="unknown axis name 'model'"):
        jax.jit(f)(jnp.ones(2))


def test_bad_arguments_raise_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="tiled=False, axis 0 must have the group size 1"):
        jax_ext.reduce_scatter(jnp.ones(3))
    with pytest.raises(ValueError, match="out of range"):
        jax_ext.ppermute(jnp.ones(3), perm=[(0, 1)])
    with pytest.raises(ValueError, match="dest 1 out of range"):
        jax_ext.send(jnp.ones(3), 1)
    with pytest.raises(ValueError, match="root 2 out of range"):
        jax_ext.broadcast(jnp.ones(3), root=2)
    with pytest.raises(TypeError, match="unsupported|dtype"):
        jax.jit(jax_ext.all_reduce)(jnp.ones(3, bool))
    with pytest.raises(TypeError, match="avg"):
        jax.jit(lambda v: jax_ext.all_reduce(v, "avg"))(jnp.ones(3, jnp.int32))
    with pytest.raises(TypeError, match="aioccl.Communicator"):
        jax_ext.all_reduce(jnp.ones(3), comm="world")  # type: ignore[arg-type]
    # and the default communicator still works
    np.testing.assert_array_equal(jax.jit(jax_ext.all_reduce)(jnp.arange(3.0)), np.arange(3.0))


def test_one_rank_default_comm_runs_every_op() -> None:
    x = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(jax.jit(jax_ext.all_gather)(x), x[None])
    np.testing.assert_array_equal(jax.jit(lambda v: jax_ext.reduce_scatter(v, tiled=True))(x), x)
    np.testing.assert_array_equal(jax.jit(jax_ext.all_to_all)(x[:1]), x[:1])
    np.testing.assert_array_equal(jax.jit(lambda v: jax_ext.ppermute(v, perm=[(0, 0)]))(x), x)
    np.testing.assert_array_equal(jax.jit(lambda v: jax_ext.ppermute(v, perm=[]))(x), np.zeros((2, 3)))
    np.testing.assert_array_equal(jax.jit(lambda v: jax_ext.sendrecv(v, 0, 0))(x), x)
    jax.jit(lambda: jax_ext.barrier())()
    np.testing.assert_array_equal(jax_ext.all_reduce(x), x)  # eagerly, outside jit


async def test_calling_from_the_engine_loop_thread_raises() -> None:
    """An inline communicator's loop cannot also block in the host callback: a clear error, not a hang."""
    uid = aioccl.UniqueId.new(host="127.0.0.1")
    comm = await aioccl.Communicator.create(uid, 0, 1, timeout=10)
    try:
        with pytest.raises(RuntimeError, match="engine thread"):
            jax.jit(lambda v: jax_ext.all_reduce(v, comm=comm))(jnp.ones(3))
        # from another thread it works (the loop stays free to run the op)
        out = await asyncio.to_thread(lambda: np.asarray(jax.jit(lambda v: jax_ext.all_reduce(v, comm=comm))(
            jnp.ones(3))))
        np.testing.assert_array_equal(out, np.ones(3))
    finally:
        await comm.close()


def test_group_layout_numbers_like_axis_index() -> None:
    """Positions inside a group are row-major over the axes in the order given (lax.axis_index's rule)."""
    color, pos = group_layout((2, 3), ("x", "y"), ("y",))
    assert color.tolist() == [0, 0, 0, 1, 1, 1] and pos.tolist() == [0, 1, 2, 0, 1, 2]
    color, pos = group_layout((2, 3), ("x", "y"), ("y", "x"))
    assert color.tolist() == [0] * 6 and pos.tolist() == [0, 2, 4, 1, 3, 5]
    color, pos = group_layout((2, 3), ("x", "y"), ("x",))
    assert color.tolist() == [0, 1, 2, 0, 1, 2] and pos.tolist() == [0, 0, 0, 1, 1, 1]


def test_a_failed_ops_runtime_token_does_not_fail_the_next_op() -> None:
    """On a GPU a failed callback's execution completes after dispatch, so its output token carries the error,
    and JAX raised it again for every later ordered call. Our token hand-over replaces such a token: the
    failure stays that op's. (On CPU a callback's error is raised at dispatch; the poisoned token is built here.)"""
    from jax._src import core, dispatch

    from jax_ext import _compat

    class FailedBuffer:  # a token buffer whose computation failed
        def block_until_ready(self) -> None:
            raise RuntimeError("collective mismatch at seq 7 (the previous op's error)")

    f = jax.jit(jax_ext.all_reduce)
    np.testing.assert_array_equal(f(jnp.arange(3.0)), np.arange(3.0))
    dispatch.runtime_tokens.current_tokens[_compat.EFFECT] = core.Token(FailedBuffer())
    np.testing.assert_array_equal(f(jnp.arange(3.0) + 1), np.arange(3.0) + 1)
    assert not isinstance(dispatch.runtime_tokens.current_tokens[_compat.EFFECT]._buf, FailedBuffer)


def test_a_process_level_op_on_an_array_sharded_over_devices_is_refused_clearly() -> None:
    """XLA's partitioner cannot place a side-effecting op over several devices (its RET_CHECK aborted the
    compile with an internal error): the lowering refuses it first, naming the op and what to do instead."""
    code = """if True:
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import jax, jax.numpy as jnp, jax_ext
        from jax.sharding import NamedSharding, PartitionSpec as P
        mesh = jax.make_mesh((2,), ("i",))
        for spec in (P("i"), P()):
            x = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, spec))
            try:
                jax.jit(jax_ext.all_reduce)(x)
            except ValueError as e:
                assert str(e).startswith("all_reduce: a process-level op") and "shard_map" in str(e), e
            else:
                raise AssertionError(spec)
        print(jax.jit(jax_ext.all_reduce)(jax.device_put(jnp.arange(4.0), jax.devices()[1])))
        print("REFUSED OK")
        """
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "REFUSED OK" in r.stdout, (r.stdout[-2000:], r.stderr[-4000:])
    assert "RET_CHECK" not in r.stderr, r.stderr[-4000:]


def test_the_persistent_compilation_cache_takes_jax_ext_programs_on_one_and_on_several_devices(tmp_path) -> None:
    """With JAX's persistent compilation cache on, a program that runs jax_ext ops on two devices of a process and
    one on one device are exact, and a second process reads them back; where jaxlib crashes writing the
    several-device one (0.10: a segfault in xla::Layout::ToProto), it is kept out of the cache instead."""
    code = """if True:
        import os, sys
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import jax, numpy as np, jax_ext
        jax.config.update("jax_compilation_cache_dir", sys.argv[1])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        hits = []
        jax.monitoring.register_event_listener(lambda name, **_: hits.append(name.endswith("/cache_hits")))
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("i",))
        x = np.arange(8, dtype=np.float32)
        two = jax.jit(jax.shard_map(lambda v: jax_ext.psum(v, "i"), mesh=mesh, in_specs=jax.P("i"),
                                    out_specs=jax.P("i")))(x)
        two_hit = sum(hits)
        one = jax.jit(lambda v: jax_ext.all_reduce(v) * 2)(x)
        assert np.array_equal(np.asarray(two), np.tile(x[:4] + x[4:], 2)), two
        assert np.array_equal(np.asarray(one), x * 2), one
        print("CACHE", two_hit, sum(hits) - two_hit)
        """
    outs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
        outs.append(next(ln for ln in r.stdout.splitlines() if ln.startswith("CACHE")))
    several = "0" if jax_ext._compat._SERIALIZING_CRASHES else "1"
    assert outs == ["CACHE 0 0", f"CACHE {several} 1"], outs


def test_psum_takes_int16_and_complex_as_lax_does() -> None:
    """16-bit integers go as 32-bit ones (wrapping as lax's do), complex numbers as their two parts (sum,
    mean); bit for bit equal to jax.lax on a mesh of four devices. Errors name the API called."""
    code = """if True:
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, numpy as np, jax_ext
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("i",))
        def run(fn, x):
            return np.asarray(jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i")))(x))
        wide = np.arange(8) * 7000 % 65536  # sums past 2**15: they wrap
        cases = [(wide.astype(np.int16), ("psum", "pmax", "pmin")), (wide.astype(np.uint16), ("psum", "pmax", "pmin")),
                 ((np.arange(8) + 1j * np.arange(8)[::-1]).astype(np.complex64), ("psum", "pmean"))]
        for x, names in cases:
            for name in names:
                ours = run(lambda v: getattr(jax_ext, name)(v, "i"), x)
                ref = run(lambda v: getattr(jax.lax, name)(v, "i"), x)
                assert ours.dtype == ref.dtype == x.dtype and np.array_equal(ours, ref), (name, x.dtype, ours, ref)
        for name, x in (("pmax", np.ones(8, np.complex64)), ("psum", np.ones(8, np.bool_))):
            try:
                run(lambda v: getattr(jax_ext, name)(v, "i"), x)
            except TypeError as e:
                assert str(e).startswith(name + ":"), e
            else:
                raise AssertionError((name, x.dtype))
        print("DTYPES OK")
        """
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "DTYPES OK" in r.stdout, (r.stdout[-2000:], r.stderr[-4000:])


def test_psum_inside_pmap_equals_lax() -> None:
    code = """if True:
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, jax.numpy as jnp, numpy as np, jax_ext
        x = jnp.arange(8.0).reshape(4, 2)
        ours = jax.pmap(lambda v: jax_ext.psum(v, "i"), axis_name="i")(x)
        ref = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(x)
        assert np.array_equal(np.asarray(ours), np.asarray(ref)), (ours, ref)
        print("PMAP OK")
        """
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "PMAP OK" in r.stdout, (r.stdout[-2000:], r.stderr[-4000:])
