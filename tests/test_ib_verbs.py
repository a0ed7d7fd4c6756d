"""Detection (every reason), selection, the pyverbs adapter's work requests and QP attributes,
and the real-NIC tests (``rdma`` marker, skipped here with the detection's reason)."""

from __future__ import annotations

import os
import socket
import sys
from types import SimpleNamespace

import pytest

import aioccl
from aioccl.errors import BootstrapError
from aioccl.transport.ib import detect as det
from aioccl.transport.ib import setup as ib_setup
from aioccl.transport.ib.verbs import WC_RECV_IMM, WC_WRITE, Endpoint, Piece, Region

from conftest import launch


# -- detection -------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,dev,port,want", [
    ("", "mlx5_0", 1, True), ("mlx5", "mlx5_3", 2, True), ("mlx5_0:1", "mlx5_0", 2, False),
    ("=mlx5_1", "mlx5_10", 1, False), ("=mlx5_1", "mlx5_1", 1, True), ("^mlx5_2", "mlx5_2", 1, False),
    ("^mlx5_2", "mlx5_0", 1, True), ("mlx5_0:1,mlx5_1:2", "mlx5_1", 2, True), ("^=rxe0", "rxe01", 1, True),
])
def test_hca_spec_like_nccl(spec, dev, port, want):
    assert det.hca_selects(spec, dev, port) is want


def _gid(s: str):
    return SimpleNamespace(__str__=lambda self=None: s)


class FakeVerbs:
    """Stands in for pyverbs.device: devices -> ports -> (state, link layer, lid, gid table, gid types)."""

    def __init__(self, devices=None, raises=None):
        self.devices, self.raises = devices or {}, raises

    def get_device_list(self):
        if self.raises:
            raise self.raises
        return [SimpleNamespace(name=n.encode()) for n in self.devices]

    def Context(self, name):  # noqa: N802 (the pyverbs name)
        ports = self.devices[name]

        class Ctx:
            def query_device(self):
                return SimpleNamespace(phys_port_cnt=len(ports))

            def query_port(self, p):
                state, link, lid, gids, _types = ports[p - 1]
                return SimpleNamespace(state=state, link_layer=link, lid=lid, gid_tbl_len=len(gids))

            def query_gid(self, p, i):
                return ports[p - 1][3][i]

            def query_gid_type(self, p, i):
                return ports[p - 1][4][i]

        return Ctx()


ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
LINKLOCAL = "fe80:0000:0000:0000:0202:c9ff:fe00:0001"
V4MAPPED = "0000:0000:0000:0000:0000:ffff:0a00:0001"


@pytest.mark.parametrize("env,verbs,want_ok,want", [
    ({"AIOCCL_IB_DISABLE": "1"}, FakeVerbs(), False, "disabled by AIOCCL_IB_DISABLE=1"),
    ({}, FakeVerbs(raises=RuntimeError("Failed to get devices list")), False, "kernel has no uverbs (ENOSYS)"),
    ({}, FakeVerbs({}), False, "no RDMA device"),
    ({}, FakeVerbs({"mlx5_0": [(1, 1, 0, [LINKLOCAL], [0])]}), False, "mlx5_0:1 port down (state DOWN)"),
    ({}, FakeVerbs({"mlx5_0": [(4, 1, 0, [LINKLOCAL], [0])]}), False, "no LID assigned"),
    ({}, FakeVerbs({"mlx5_0": [(4, 1, 7, [LINKLOCAL], [0])]}), True, "mlx5_0:1 (InfiniBand, GID index 0)"),
    ({}, FakeVerbs({"rxe0": [(4, 2, 0, [ZERO, ZERO], [1, 2])]}), False, "no usable GID"),
    ({}, FakeVerbs({"rxe0": [(4, 2, 0, [LINKLOCAL, LINKLOCAL, V4MAPPED, V4MAPPED], [1, 2, 1, 2])]}), True,
     "rxe0:1 (Ethernet, GID index 3)"),
    ({"AIOCCL_IB_GID_INDEX": "1"}, FakeVerbs({"rxe0": [(4, 2, 0, [LINKLOCAL, ZERO], [1, 2])]}), False,
     "GID index 1 is empty"),
    ({"AIOCCL_IB_GID_INDEX": "x"}, FakeVerbs({}), False, "AIOCCL_IB_GID_INDEX='x'"),
    ({"AIOCCL_IB_HCA": "^mlx5"}, FakeVerbs({"mlx5_0": [(4, 1, 7, [LINKLOCAL], [0])]}), False,
     "no RDMA device matches AIOCCL_IB_HCA='^mlx5' (found: mlx5_0)"),
    ({"AIOCCL_IB_HCA": "mlx5_1"}, FakeVerbs({"mlx5_0": [(1, 1, 7, [LINKLOCAL], [0])],
                                             "mlx5_1": [(4, 1, 9, [LINKLOCAL], [0])]}), True, "mlx5_1:1"),
    ({"AIOCCL_IB_BACKEND": "loopback"}, None, True, "loopback test backend"),
    ({"AIOCCL_IB_BACKEND": "dpdk"}, None, False, "is not one of pyverbs, loopback"),
])
def test_detection_reasons(monkeypatch, env, verbs, want_ok, want):
    monkeypatch.setattr(det, "UVERBS_SYSFS", "/nonexistent/infiniband_verbs")
    v = det.probe(env, verbs)
    assert v.usable is want_ok and want in v.reason, v


def test_detection_without_pyverbs_and_its_cache_never_raise(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyverbs.device", None)  # import fails
    v = det.probe({})
    assert not v.usable and v.reason.startswith("pyverbs not installed") and "python3-pyverbs" in v.reason
    monkeypatch.setattr(det, "probe", lambda env: 1 / 0)
    det._cache.clear()
    v = det.detect({"AIOCCL_IB_HCA": "cache-test"})
    assert not v.usable and "ZeroDivisionError" in v.reason
    assert det.detect({"AIOCCL_IB_HCA": "cache-test"}) is v
    det._cache.clear()


def test_this_machines_verdict_is_shown_by_aioccl_info():
    from aioccl.tools.info import collect

    v = det.detect()
    info = collect()["transports"]["ib"]
    assert info == ("available: " if v.usable else "unavailable: ") + v.reason


# -- selection -------------------------------------------------------------------------------------
def _table(*entries):
    return [{"host": h, "ib": ib, "ib_reason": "no RDMA device" if not ib else "usable"} for h, ib in entries]


def test_pairs_choose_ib_only_across_hosts_unless_forced():
    t = _table(("a", "pyverbs"), ("a", "pyverbs"), ("b", "pyverbs"), ("b", ""))
    assert ib_setup.choose(t, 0, "auto") == {2}
    assert ib_setup.choose(t, 2, "auto") == {0, 1}
    assert ib_setup.choose(t, 3, "auto") == set()
    assert ib_setup.choose(t, 0, "socket") == set()
    assert ib_setup.choose(t[:3], 0, "ib") == {1, 2}
    with pytest.raises(BootstrapError, match="rank 3 cannot use ib: no RDMA device"):
        ib_setup.choose(t, 0, "ib")
    with pytest.raises(BootstrapError, match="backends differ"):
        ib_setup.choose(_table(("a", "pyverbs"), ("b", "loopback")), 0, "ib")


def test_settings_are_checked():
    s = ib_setup.settings({"AIOCCL_IB_BUFFSIZE": "100000", "AIOCCL_IB_SLOTS": "4"})
    assert (s.net, s.slot, s.nslots, s.timeout, s.retry_cnt) == ("auto", 100000 // 64 * 64, 4, 20, 7)
    for bad in ({"AIOCCL_NET": "rdma"}, {"AIOCCL_IB_SLOTS": "1"}, {"AIOCCL_IB_BUFFSIZE": "x"},
                {"AIOCCL_IB_TIMEOUT": "32"}):
        with pytest.raises(aioccl.InvalidArgument):
            ib_setup.settings(bad)


# -- the pyverbs adapter (needs pyverbs importable; `make test` provides Debian's) -----------------
def _pyverbs():
    try:
        import pyverbs.wr  # noqa: F401

        from aioccl.transport.ib import pyverbs_backend
    except ImportError as e:
        pytest.skip(f"pyverbs not importable ({e}): install python3-pyverbs or run scripts/provide-pyverbs.sh")
    return pyverbs_backend


def test_adapter_builds_rdma_write_with_immediate():
    pb = _pyverbs()
    import pyverbs.enums as e

    r1, r2 = Region(0x10000, 4096, 11, 111), Region(0x90000, 1 << 20, 22, 222)
    pieces = [Piece(r1, 64, 48), Piece(r2, 4096, 1000)]
    wr = pb.write_wr(0x1234, pieces, raddr=0x7000, rkey=0xBEEF, imm=0x01020304)
    assert (wr.wr_id, wr.opcode, wr.num_sge) == (0x1234, e.IBV_WR_RDMA_WRITE_WITH_IMM, 2)
    assert wr.imm_data == socket.htonl(0x01020304) and wr.send_flags == e.IBV_SEND_SIGNALED
    sg = pb.sges(pieces)
    assert [(s.addr, s.length, s.lkey) for s in sg] == [(0x10040, 48, 11), (0x91000, 1000, 22)]
    send = pb.send_wr(7, [Piece(r1, 8, 8)])
    assert (send.opcode, send.num_sge, send.send_flags) == (e.IBV_WR_SEND, 1, e.IBV_SEND_SIGNALED)
    assert (pb.recv_wr(9, [Piece(r1, 0, 8)]).wr_id, pb.recv_wr(9, [Piece(r1, 0, 8)]).num_sge) == (9, 1)


def test_adapter_builds_rtr_rts_attributes():
    pb = _pyverbs()
    mine = Endpoint(0x11, 0xAAAA, 0, "fe80:0000:0000:0000:0202:c9ff:fe00:0001", 5)
    roce = Endpoint(0x22, 0xBBBB, 0, "0000:0000:0000:0000:0000:ffff:0a00:0002", 3)
    a = pb.rts_attr(1, 3, mine, roce, timeout=18, retry_cnt=6, sl=2, traffic_class=106)
    assert (a.dest_qp_num, a.rq_psn, a.sq_psn, a.path_mtu) == (0x22, 0xBBBB, 0xAAAA, 3)
    assert (a.timeout, a.retry_cnt, a.rnr_retry, a.qp_access_flags) == (18, 6, 7, 7)
    ah = a.ah_attr
    assert (ah.is_global, ah.port_num, ah.sgid_index, ah.sl, ah.traffic_class) == (1, 1, 3, 2, 106)
    assert str(ah.dgid) == roce.gid
    ib = pb.rts_attr(2, 0, mine, Endpoint(0x33, 1, 17, "", 5))
    assert (ib.ah_attr.is_global, ib.ah_attr.dlid, ib.ah_attr.port_num, ib.path_mtu) == (0, 17, 2, 5)


def test_adapter_translates_completions():
    pb = _pyverbs()
    import pyverbs.enums as e
    from pyverbs.cq import WC

    c = pb.completion(WC(wr_id=5, status=e.IBV_WC_SUCCESS, opcode=e.IBV_WC_RECV_RDMA_WITH_IMM,
                         byte_len=4096, imm_data=socket.htonl(77)))
    assert (c.wr_id, c.opcode, c.byte_len, c.imm, c.error) == (5, WC_RECV_IMM, 4096, 77, None)
    assert pb.completion(WC(wr_id=6, status=0, opcode=e.IBV_WC_RDMA_WRITE)).opcode == WC_WRITE
    bad = pb.completion(WC(wr_id=8, status=e.IBV_WC_REM_ACCESS_ERR, opcode=0, vendor_err=0x88))
    assert bad.wr_id == 8 and "access" in bad.error.lower() and "0x88" in bad.error


def test_channel_fd_discovery():
    pb = _pyverbs()
    assert pb._new_fd(lambda: SimpleNamespace(fd=42))[1] == 42  # newer pyverbs: .fd
    fds = []

    def not_ib():
        fds.append(os.eventfd(0))
        return object()

    with pytest.raises(OSError, match="cannot find the completion channel's fd"):
        pb._new_fd(not_ib)
    os.close(fds[0])


# -- a real NIC ------------------------------------------------------------------------------------
def _need_rdma():
    v = det.detect({k: v for k, v in os.environ.items() if k != "AIOCCL_IB_BACKEND"})
    if not v.usable or v.backend != "pyverbs":
        pytest.skip(f"no usable RDMA port: {v.reason}")


@pytest.mark.rdma
async def test_rdma_every_op_in_process_over_a_real_port(monkeypatch):
    _need_rdma()
    from test_ib_loopback import _matrix

    from _check import DTYPES
    from conftest import close_all, make_comms

    monkeypatch.setitem(__import__("conftest").TRANSPORT_ENV, "ib",
                        {"AIOCCL_SHM_DISABLE": "1", "AIOCCL_NET": "ib", "AIOCCL_IB_BACKEND": "pyverbs"})
    comms = await make_comms(2, transport="ib")
    try:
        await _matrix(comms, DTYPES, [0, 1, 37, 300_000])
    finally:
        await close_all(comms)


@pytest.mark.rdma
def test_rdma_every_op_across_processes():
    _need_rdma()
    r = launch(2, "collectives.py", env={"AIOCCL_NET": "ib", "AIOCCL_SHM_DISABLE": "1", "EXPECT_TRANSPORT": "ib"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count(" 0 failures") == 2, r.stdout


def test_importing_pyverbs_leaves_the_applications_logging_alone():
    import logging
    import subprocess

    code = ("import logging; from aioccl.transport.ib.detect import import_pyverbs\n"
            "try:\n    import_pyverbs()\nexcept ImportError:\n    pass\n"
            "r = logging.getLogger(); print(len(r.handlers), r.level)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", str(logging.WARNING)], out
