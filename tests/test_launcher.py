"""aioccl-run: environment, prefixed output, fail-fast naming the rank, signal forwarding."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, WORKERS, launch, orphaned_segments, shm_segments


def test_prefixes_and_environment():
    proc = launch(3, "echo_env.py")
    assert proc.returncode == 0, proc.stderr
    lines = sorted(ln for ln in proc.stdout.splitlines() if "world=" in ln)
    assert lines == [f"[rank {r}] rank={r} world=3 local={r}" for r in range(3)]


def test_failing_rank_stops_the_rest_and_is_named():
    t0 = time.monotonic()
    proc = launch(3, "fail_one.py")
    assert proc.returncode == 3
    assert "rank 1 exited with code 3" in proc.stderr
    assert time.monotonic() - t0 < 60  # the others were stopped, not waited for


def test_sigterm_is_forwarded():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", str(WORKERS / "sleeper.py")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    out = ""
    while "ready" not in out and time.monotonic() < deadline:
        out += p.stdout.readline()
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=60)
    assert "got SIGTERM" in out + rest
    assert p.returncode != 0


def test_module_target_and_arguments():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", "-m", "json.tool", "--help"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("usage:") == 2 and "[rank 1] usage:" in p.stdout


def _affinities(n: int, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    show = "import os; print('cores', sorted(os.sched_getaffinity(0)))"
    return subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(n), *flags, "--no-python",
                           sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=60)


def test_bind_to_core_gives_each_local_rank_a_core_of_its_own_and_none_leaves_them_free():
    usable = sorted(os.sched_getaffinity(0))
    p = _affinities(2, "--bind-to", "core")
    assert p.returncode == 0, p.stderr
    got = sorted(ln.split("cores ")[1] for ln in p.stdout.splitlines() if "cores" in ln)
    assert got == sorted(str([c]) for c in usable[:2]) if len(usable) >= 2 else got == [str(usable)] * 2, got
    free = _affinities(2)
    assert [ln.split("cores ")[1] for ln in free.stdout.splitlines() if "cores" in ln] == [str(usable)] * 2
    over = _affinities(len(usable) + 1, "--bind-to", "core")  # more ranks than cores: said, and not bound
    assert over.returncode == 0 and "not binding" in over.stderr, over.stderr
    assert over.stdout.count(str(usable)) == len(usable) + 1, over.stdout


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start_holding(n: int, tmp: Path | None = None) -> tuple[subprocess.Popen[str], list[int]]:
    """aioccl-run with n ranks that joined over shared memory and now hang; returns their pids. ``tmp``: its
    TMPDIR, for a launcher a test kills (the folder it would remove on its way out stays there)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"TMPDIR": str(tmp)} if tmp is not None else {})}
    proc = subprocess.Popen([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(n),
                             str(WORKERS / "shm_hold.py")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    pids: list[int] = []
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while len(pids) < n and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "] ready pid=" in line:  # "[rank r] ready pid=N"
            pids.append(int(line.split("=")[1]))
    assert len(pids) == n, "the ranks did not come up"
    return proc, pids


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # everything already exited
    proc.wait(10)


def _wait_gone(pids: list[int], within: float) -> None:
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "orphan ranks left behind"


def _segments() -> set[str]:
    from aioccl.transport.shm.segment import SHM_DIR

    return shm_segments() if os.path.isdir(SHM_DIR) else set()


def _no_segments_left(before: set[str], pids: list[int]) -> bool:
    """Nothing of this job's in /dev/shm (other tests' segments may come and go beside it)."""
    return not _segments() or not (orphaned_segments(before) or shm_segments(tuple(pids)))


def test_killed_rank_stops_the_others_within_5s_and_is_named():
    before = _segments()
    proc, pids = _start_holding(3)
    try:
        with open(f"/proc/{pids[1]}/environ", "rb") as f:
            rank = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)[b"AIOCCL_RANK"].decode()
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        _kill_group(proc)
    assert proc.returncode != 0
    assert f"failed: first failure: rank {rank} was killed by SIGKILL" in err, err
    assert took < 5, f"the launcher took {took:.1f}s to stop the others"
    _wait_gone(pids, 5)
    assert _no_segments_left(before, pids)


def test_ctrl_c_reaches_every_rank_and_leaves_nothing():
    before = _segments()
    proc, pids = _start_holding(3)
    try:
        proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends the launcher
        _, err = proc.communicate(timeout=30)
    finally:
        _kill_group(proc)
    assert proc.returncode == 128 + signal.SIGINT, err
    interrupted = {ln.split("]")[0] for ln in err.splitlines() if ln.endswith("] KeyboardInterrupt")}
    assert interrupted == {"[rank 0", "[rank 1", "[rank 2"}, err  # each rank got SIGINT itself
    _wait_gone(pids, 5)
    assert _no_segments_left(before, pids)


def test_ranks_die_with_a_killed_launcher(tmp_path):
    proc, pids = _start_holding(2, tmp_path)
    try:
        os.kill(proc.pid, signal.SIGKILL)  # no chance to forward anything
        proc.wait(10)
        _wait_gone(pids, 5)
    finally:
        _kill_group(proc)


def test_several_nodes_take_torchruns_default_port_and_a_missing_secret_says_how_to_make_one():
    """``aioccl-run --nnodes 2 --node-rank N --master-addr A`` as the getting-started page writes it: the port
    defaults to 29500 as under torchrun, and without a secret the error shows the command that makes one."""
    from aioccl.run import DEFAULT_MASTER_PORT, child_envs, parse

    ns = parse(["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--nproc-per-node", "2", "x.py"])
    assert ns.master_port == DEFAULT_MASTER_PORT == 29500
    with pytest.raises(SystemExit) as e:
        child_envs(ns, {})
    assert "export AIOCCL_COMM_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(16))')" in str(e.value)
    envs = child_envs(ns, {"AIOCCL_COMM_SECRET": "ab" * 16})
    assert [env["MASTER_PORT"] for env in envs] == ["29500", "29500"]
    assert {env["AIOCCL_COMM_ID"] for env in envs} == {"10.0.0.1:29501"}


def test_a_timeout_is_printed_once_by_its_rank_and_once_in_the_launchers_summary(tmp_path):
    """Not also as a log line when the op is awaited: the traceback and aioccl-run's summary say it."""
    script = tmp_path / "timeout.py"
    script.write_text("import time\nimport numpy as np\nimport aioccl\ncomm = aioccl.init_sync(timeout=30)\n"
                      "if comm.rank == 0:\n    comm.all_reduce(np.ones(3), timeout=1.0).wait()\n"
                      "else:\n    time.sleep(3)\n")
    proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", str(script)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert out.count("timed out after 1s waiting for ranks [1]") == 2, out
    assert "aioccl-run: failed: first failure: rank 0 exited with code 1: CollectiveTimeout" in out, out


def test_the_launchers_ports_are_held_for_the_job_and_a_taken_one_is_named_before_any_rank_starts(tmp_path):
    """Its store and root ports stay bound by aioccl-run while the ranks run (no other process can take them
    between the choice and the bind); a --master-port in use fails at once, naming the port."""
    script = tmp_path / "probe.py"
    script.write_text("import os, socket\nimport aioccl\ncomm = aioccl.init_sync(timeout=30)\n"
                      "s = socket.socket()\ntry:\n    s.bind(('127.0.0.1', int(os.environ['MASTER_PORT'])))\n"
                      "    print('PROBE bound: the port was free')\nexcept OSError as e:\n"
                      "    print('PROBE held', e.errno)\ncomm.close()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("PROBE held 98") == 2, proc.stdout  # EADDRINUSE

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "2", "--master-port",
                               str(port), str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and time.monotonic() - t0 < 20
    assert f"--master-port (torch's store; aioccl's root takes the next port): port {port}-{port + 1} on this " \
           f"host is taken" in proc.stderr, proc.stderr
    assert "PROBE" not in proc.stdout  # no rank started


def test_a_reservation_keeps_plain_binds_out_and_lets_the_intended_listener_in():
    from aioccl.bootstrap.ports import PortTaken, reserve

    with reserve("127.0.0.1", count=2) as r:
        assert r.ports == [r.port, r.port + 1]
        for p in r.ports:
            with socket.socket() as other, pytest.raises(OSError):
                other.bind(("127.0.0.1", p))
        with socket.socket() as root:  # what aioccl's root and torch's TCPStore do
            root.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            root.bind(("127.0.0.1", r.port))
            root.listen()
            with pytest.raises(PortTaken, match=f"--master-port: port {r.port} on 127.0.0.1 is taken"):
                reserve("127.0.0.1", r.port, what="--master-port")


def test_several_ranks_get_one_intra_op_thread_each_unless_omp_num_threads_is_set(tmp_path):
    """As torchrun: with more than one rank per node and OMP_NUM_THREADS unset, each rank gets
    OMP_NUM_THREADS=1 (torch sees one intra-op thread) and the launcher says so once; a value the user set,
    or a single rank, is left alone and nothing is said."""
    pytest.importorskip("torch")
    script = tmp_path / "threads.py"
    script.write_text("import os\nimport sys\n"
                      "if sys.argv[1:] == ['torch']:\n    import torch\n    n = torch.get_num_threads()\n"
                      "else:\n    n = None\n"
                      "print('threads', os.environ.get('OMP_NUM_THREADS'), n)\n")
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}

    def run(nproc: int, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", str(nproc), str(script),
                               *args], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                              timeout=120)

    four = run(4, base, "torch")
    assert four.returncode == 0, four.stderr
    assert sorted(four.stdout.split("\n"))[1:] == [f"[rank {r}] threads 1 1" for r in range(4)], four.stdout
    assert four.stderr.count("setting OMP_NUM_THREADS=1 for each of the 4 ranks") == 1, four.stderr
    mine = run(2, {**base, "OMP_NUM_THREADS": "3"})
    assert sorted(mine.stdout.split("\n"))[1:] == [f"[rank {r}] threads 3 None" for r in range(2)], mine.stdout
    assert "OMP_NUM_THREADS" not in mine.stderr, mine.stderr
    one = run(1, base)
    assert one.stdout.strip() == "[rank 0] threads None None" and "OMP_NUM_THREADS" not in one.stderr, one
    helped = subprocess.run([sys.executable, "-m", "aioccl.run", "--help"], capture_output=True, text=True,
                            env={**base, "PYTHONPATH": str(ROOT)})
    assert "OMP_NUM_THREADS=1" in " ".join(helped.stdout.split()), helped.stdout


def test_each_rank_runs_in_a_session_of_its_own(tmp_path):
    """As torchrun: under the kernel's autogroup scheduling, CPU time is shared between sessions, so ranks in
    the launcher's session would share one session's part beside other jobs. Signals are forwarded anyway."""
    script = tmp_path / "session.py"
    script.write_text("import os\nprint('session', os.getsid(0), os.getpid())\n")
    proc = subprocess.run([sys.executable, "-m", "aioccl.run", "--nproc-per-node", "3", str(script)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    sessions = [ln.split()[-2:] for ln in proc.stdout.splitlines() if " session " in ln]
    assert len(sessions) == 3 and all(sid == pid for sid, pid in sessions), proc.stdout
    assert str(os.getsid(0)) not in {sid for sid, _ in sessions}
