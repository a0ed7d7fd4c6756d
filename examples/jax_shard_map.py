"""A 2-D mesh (data x model) in shard_map, its collectives run by aioccl: one rank per device.

    python examples/jax_shard_map.py            # 4 CPU devices in one process
    aioccl-run --nproc-per-node 2 examples/jax_shard_map.py --devices 2   # 2 processes x 2 devices

A tensor-parallel two-layer network: the batch is split over ``data``, the
hidden layer's columns over ``model``. The forward pass gathers the hidden
activations along ``model`` (``jax_ext.all_gather``), the loss is summed over
both axes (``jax_ext.psum``), and ``jax.grad`` runs the transposes (a
``psum_scatter`` for the gather). The result and the gradients are checked
against the same computation written with plain ``jax.numpy`` on one device.
"""

from __future__ import annotations

import argparse
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--devices", type=int, default=4, help="CPU devices per process")
args = ap.parse_args()
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if "AIOCCL_RANK" in os.environ and int(os.environ["AIOCCL_WORLD_SIZE"]) > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # to place the sharded inputs
    # JAX needs its own coordinator to place sharded inputs: on MASTER_PORT, which aioccl-run (like torchrun)
    # sets aside for the framework's own store, else next to aioccl's root port
    port = os.environ.get("MASTER_PORT") or int(os.environ["AIOCCL_COMM_ID"].rpartition(":")[2]) + 1
    jax.distributed.initialize(f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{port}",
                               int(os.environ["AIOCCL_WORLD_SIZE"]), int(os.environ["AIOCCL_RANK"]))

import jax_ext  # noqa: E402

mesh = jax.make_mesh((2, len(jax.devices()) // 2), ("data", "model"))
x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6) % 5 - 2
w1 = np.arange(6 * 8, dtype=np.float32).reshape(6, 8) % 3 - 1
w2 = np.arange(8 * 3, dtype=np.float32).reshape(8, 3) % 4 - 2


def local_loss(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = x @ w1  # (batch/data, hidden/model)
    h = jax_ext.all_gather(h, "model", axis=1, tiled=True)  # (batch/data, hidden)
    y = jnp.maximum(h, 0) @ w2
    total: jax.Array = jax_ext.psum(jnp.sum(y * y), ("data", "model"))  # jax_ext takes and gives pytrees: Any
    return total / int(mesh.shape["model"])


sharded = jax.jit(jax.shard_map(jax.value_and_grad(local_loss, argnums=(1, 2)), mesh=mesh,
                                in_specs=(P("data"), P(None, "model"), P()), out_specs=(P(), (P(None, "model"), P()))))


def reference(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    y = jnp.maximum(x @ w1, 0) @ w2
    return jnp.sum(y * y)


def put(a: np.ndarray, spec: P) -> jax.Array:
    return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda idx: a[idx])


loss, (g1, g2) = sharded(put(x, P("data")), put(w1, P(None, "model")), put(w2, P()))
ref_loss, (r1, r2) = jax.value_and_grad(reference, argnums=(1, 2))(x, w1, w2)
ok = float(loss) == float(ref_loss)
for got, want in ((g1, r1), (g2, r2)):
    for shard in got.addressable_shards:
        ok &= np.array_equal(np.asarray(shard.data), np.asarray(want)[shard.index])
print(f"mesh {dict(mesh.shape)} on {jax.process_count()} process(es): loss {float(loss)} "
      f"(one device: {float(ref_loss)}), "
      f"gradients {'equal' if ok else 'DIFFERENT'}")
jax_ext.shutdown()
sys.exit(0 if ok else 1)
