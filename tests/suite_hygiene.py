"""The suite leaves the machine as it found it: no file, folder, shared-memory segment or process.

The controlling pytest process (not an xdist worker) makes one folder for the run and points ``TMPDIR`` at
it, so every temporary file of the suite, its workers and every process they start lands there, pytest's
own ``tmp_path`` folders included. At the end of the run it looks for what is left:

- a process whose environment carries this run's tag (``AIOCCL_TEST_SESSION``), but pytest's own;
- a segment in ``/dev/shm`` that was not there when the run began, but a live process's of another run or program;
- a file in the machine's temporary folder, new since the run began, named as the suite's are (``OURS``);
- anything in the run's folder but pytest's ``tmp_path`` folders and caches that tools keep on purpose.

Processes and files get a few seconds to go away (a rank's last exit), then whatever is left is named, removed,
and fails the run: a new leak is found by the run that brings it, not by the next user.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

TAG = "AIOCCL_TEST_SESSION"
SHM = Path("/dev/shm")
KEPT = ("pytest-of-", "torchinductor_")  # pytest's tmp_path folders; torch's compile cache (made on purpose)
OURS = ("aioccl-", "fakecupy-", "torchelastic_", "torch-suite-", "own-", "pymp-", "tmp")  # names the suite makes
GRACE_S = 10.0

_state: dict[str, object] = {}


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def _names(folder: Path) -> set[str]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def pytest_configure(config: pytest.Config) -> None:
    if not _controller(config) or TAG in os.environ:  # a worker, or a suite run by a test of the suite
        return
    system_tmp = Path(tempfile.gettempdir())
    run_dir = Path(tempfile.mkdtemp(prefix="aioccl-suite-", dir=system_tmp))
    _state.update(run_dir=run_dir, system_tmp=system_tmp, shm=_names(SHM), tmp=_names(system_tmp))
    os.environ[TAG] = str(run_dir)
    os.environ["TMPDIR"] = str(run_dir)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


@pytest.fixture(autouse=True)
def _attribute_leftovers(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """After each test, what newly appeared in the run's folder (or /dev/shm) is noted with the test's name
    (a log per process, read at the end): the end-of-run report then says which test left what."""
    yield
    run_dir = os.environ.get(TAG)
    if run_dir is None or not os.path.isdir(run_dir):
        return
    seen = _state.setdefault("seen", _names(Path(run_dir)) | {f"shm:{n}" for n in _names(SHM)})
    now = {n for n in _names(Path(run_dir)) if not n.startswith((*KEPT, "."))} | {f"shm:{n}" for n in _names(SHM)}
    new = now - seen  # type: ignore[operator]
    if new:
        with open(os.path.join(run_dir, f".hygiene-{os.getpid()}.log"), "a") as log:
            log.writelines(f"{n} {request.node.nodeid}\n" for n in sorted(new))
    _state["seen"] = now | seen  # type: ignore[operator]


def _attributions(run_dir: Path) -> dict[str, str]:
    found = {}
    for log in run_dir.glob(".hygiene-*.log"):
        for line in log.read_text().splitlines():
            name, _, test = line.partition(" ")
            found.setdefault(name, test)
    return found


def _tagged_processes(run_dir: Path) -> dict[int, str]:
    """Processes carrying this run's tag, but this one and its xdist workers."""
    me, found = os.getpid(), {}
    want = f"{TAG}={run_dir}".encode()
    for entry in _names(Path("/proc")):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if want not in env or stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        if ppid == me and any(e.startswith(b"PYTEST_XDIST_WORKER=") for e in env):
            continue  # an xdist worker on its way out
        found[int(entry)] = cmd.strip()[:200]
    return found


def _others(segment: str, run_dir: Path) -> bool:
    """A segment of a live process that is not this run's (``aioccl-<comm>-<rank>-<pid>``, ``fakecupy-<pid>-<n>``):
    another program's, or another suite's beside this one. One whose process has ended is a leak, whoever's."""
    parts = segment.split("-")
    pid = parts[-1] if segment.startswith("aioccl-") else parts[1] if len(parts) > 2 else ""
    if not pid.isdigit():
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False  # ended: a leak
    return f"{TAG}={run_dir}".encode() not in env.split(b"\0")


def _leftovers() -> list[str]:
    run_dir, system_tmp = Path(str(_state["run_dir"])), Path(str(_state["system_tmp"]))
    left = [f"process {pid}: {cmd}" for pid, cmd in _tagged_processes(run_dir).items()]
    left += [f"{SHM / n}" for n in sorted(_names(SHM) - _state["shm"]) if not _others(n, run_dir)]  # type: ignore[operator]
    # in the machine's temporary folder, what bears a name the suite makes (anything else new there is another
    # program's, beside this run: pip's, an editor's; another run's own folder is that run's to check)
    left += [f"{system_tmp / n}" for n in sorted(_names(system_tmp) - _state["tmp"])  # type: ignore[operator]
             if n.startswith(OURS) and not n.startswith("aioccl-suite-")]
    left += [f"{run_dir / n}" for n in sorted(_names(run_dir)) if not n.startswith((*KEPT, "."))]
    return left


def _remove(what: list[str]) -> None:
    for item in what:
        if item.startswith("process "):
            try:
                os.kill(int(item.split()[1].rstrip(":")), signal.SIGKILL)
            except OSError:
                pass
        elif os.path.isdir(item) and not os.path.islink(item):
            shutil.rmtree(item, ignore_errors=True)
        else:
            try:
                os.unlink(item)
            except OSError:
                pass


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "run_dir" not in _state:
        return
    deadline = time.monotonic() + GRACE_S
    left = _leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _leftovers()
    run_dir = Path(str(_state["run_dir"]))
    _remove(left)
    blame = _attributions(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")

        def who(item: str) -> str:
            name = Path(item).name if not item.startswith(str(SHM)) else f"shm:{Path(item).name}"
            return f" (first seen after {blame[name]})" if name in blame else ""

        lines = ["the suite left these behind (now removed):", *(f"  {x}{who(x)}" for x in left)]
        if reporter is not None:
            reporter.write_sep("=", "leftovers", red=True)
            reporter.write_line("\n".join(lines))
        else:
            print("\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
