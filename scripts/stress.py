"""The hang hunter (``make stress``): the multi-process tests most likely to hang, in a loop, under randomized
CPU pressure and randomized schedules, with every hang's evidence kept.

A hang that shows once in 50 runs is invisible to a suite that runs a few times a day. This runs the tests
where ranks hand work to each other (point-to-point, the lanes, wildcards, jax_ext's native calls, shrink)
again and again for ``--minutes``, each run drawn from one seed that is printed and saved:

- which group of tests runs, in which order of files;
- CPU pressure: 0-3 busy processes, and sometimes the whole run (ranks and hogs) pinned to one core with
  ``taskset``, where a rank that spins waits for a peer that cannot run;
- the native core's schedule noise: ``AIOCCL_JITTER=<seed>`` (``aioccl/native/src/core/jitter.h``), each
  hand-off of the core yielding or sleeping first, at a rate drawn from the seed.

A run that writes nothing for ``--stall`` seconds is a hang. Before anything is killed, its folder under
``--out`` gets each live process's stacks (``py-spy dump --native``, or ``gdb -batch`` without py-spy), the
ranks' own hang dumps (``AIOCCL_HANG_DUMP``: pending ops, flight recorder, Python threads, written by the
watchdog after ``AIOCCL_WATCHDOG_S``), pytest's output and ``seed.txt``. A run that fails without hanging
keeps its output and seed too. ``--replay SEED`` runs one seed again (tests/README.md, "The hang hunter").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the tests where ranks wait on each other's hand-offs: each group is one pytest run (seconds to a minute idle)
GROUPS: dict[str, list[str]] = {
    "p2p": ["tests/test_p2p_and_sync_multiprocess.py", "tests/test_retry_receive.py"],
    "pair-lane": ["tests/test_pair_lane.py", "tests/test_pair_lane_threads.py", "tests/test_pair_lane_room.py",
                  "tests/test_shm_pairs.py"],
    "lanes": ["tests/test_lane_calls.py", "tests/test_lanes.py"],
    "wildcards": ["tests/test_wildcards.py", "tests/test_mismatch_race.py"],
    "jax-native": ["tests/test_jax_native.py"],
    "shrink": ["tests/test_reliability.py", "tests/test_anyio_trio.py", "tests/test_app_failures.py"],
}
STALL_S = 100.0  # a hang: no output this long (the tests' own subprocess deadlines are 120-240 s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("STRESS_MINUTES", "60")))
    ap.add_argument("--out", default=str(ROOT / "stress-out"), help="where each hang's or failure's folder goes")
    ap.add_argument("--replay", type=int, help="run this one seed again (its groups, pressure and jitter)")
    ap.add_argument("--groups", default=",".join(GROUPS), help="comma-separated: " + ", ".join(GROUPS))
    ap.add_argument("--stall", type=float, default=STALL_S, help="seconds without output that count as a hang")
    ap.add_argument("--watchdog", type=float, default=20.0, help="AIOCCL_WATCHDOG_S of the ranks: when they dump")
    ap.add_argument("--files", nargs="+", help="run these pytest paths instead of the groups (the hunter's test)")
    args = ap.parse_args()
    # stopped (make's Ctrl-C, a kill): the run under way cleans up after itself (one_run's finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.files:
        GROUPS["given"] = args.files
        args.groups = "given"
    groups = [g for g in args.groups.split(",") if g]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown groups {sorted(unknown)}; known: {sorted(GROUPS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    spy = spy if os.access(spy, os.X_OK) else None
    print(f"stress: {args.minutes:g} min, groups {groups}, stall {args.stall:g} s, stacks by "
          f"{'py-spy' if spy else 'gdb'}, evidence under {out}", flush=True)
    tally: dict[str, list[int]] = {"pass": [], "fail": [], "hang": []}
    end = time.monotonic() + args.minutes * 60
    master = random.Random()
    while True:
        seed = args.replay if args.replay is not None else master.randrange(1, 1 << 31)
        verdict = one_run(seed, groups, out, args.stall, args.watchdog, spy)
        tally[verdict].append(seed)
        runs = sum(map(len, tally.values()))
        print(f"stress: run {runs}: seed {seed}: {verdict}  (pass {len(tally['pass'])}, fail {len(tally['fail'])}, "
              f"hang {len(tally['hang'])})", flush=True)
        if args.replay is not None or time.monotonic() >= end:
            break
    (out / "summary.json").write_text(json.dumps({"minutes": args.minutes, "groups": groups, **tally}, indent=1))
    print(f"stress: {runs} runs: {len(tally['pass'])} passed, {len(tally['fail'])} failed (seeds "
          f"{tally['fail']}), {len(tally['hang'])} hung (seeds {tally['hang']}); evidence in {out}", flush=True)
    return 1 if tally["fail"] or tally["hang"] else 0


def draw(seed: int, groups: list[str]) -> dict[str, object]:
    """Everything a run varies, from its seed alone (so ``--replay`` repeats it)."""
    rng = random.Random(seed)
    group = rng.choice(groups)
    files = list(GROUPS[group])
    rng.shuffle(files)
    return {"group": group, "files": files, "hogs": rng.choice([0, 0, 1, 2, 3]), "one_core": rng.random() < 0.3,
            "jitter_rate": rng.choice([0, 2, 10, 30]), "jitter_seed": seed}


def one_run(seed: int, groups: list[str], out: Path, stall: float, watchdog: float, spy: str | None) -> str:
    plan = draw(seed, groups)
    where = out / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{seed}"
    dump = where / "hang-dumps"
    tag = f"stress-{os.getpid()}-{seed}"
    tmp = tempfile.mkdtemp(prefix="st-")  # short: unix sockets live under it; removed after the run
    env = {**os.environ, "TMPDIR": tmp, "AIOCCL_STRESS_RUN": tag, "AIOCCL_HANG_DUMP": str(dump),
           "AIOCCL_WATCHDOG_S": f"{watchdog:g}", "PYTHONFAULTHANDLER": "1"}
    if plan["jitter_rate"]:
        env.update(AIOCCL_JITTER=str(plan["jitter_seed"]), AIOCCL_JITTER_RATE=str(plan["jitter_rate"]))
    pin = ["taskset", "-c", "0"] if plan["one_core"] and shutil.which("taskset") else []
    hogs = [subprocess.Popen([*pin, sys.executable, "-c", "while True: pass"]) for _ in range(int(plan["hogs"]))]
    cmd = [*pin, sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:randomly",
           "--timeout=900", *plan["files"]]  # pytest's own timeout far past the stall: the hunter acts first
    print(f"stress: seed {seed}: {plan}", flush=True)
    log = bytearray()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    os.set_blocking(proc.stdout.fileno(), False)  # type: ignore[union-attr]
    last = time.monotonic()
    hung = False
    try:
        while proc.poll() is None:
            chunk = proc.stdout.read()  # type: ignore[union-attr]
            if chunk:
                log += chunk
                last = time.monotonic()
            elif time.monotonic() - last > stall:
                hung = True
                break
            time.sleep(0.2)
        log += proc.stdout.read() or b""  # type: ignore[union-attr]
        if hung:
            where.mkdir(parents=True, exist_ok=True)
            collect_stacks(tag, where, spy)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        stop_all(tag, proc)
        shutil.rmtree(tmp, ignore_errors=True)
    verdict = "hang" if hung else ("pass" if proc.returncode == 0 else "fail")
    if verdict == "pass":
        shutil.rmtree(where, ignore_errors=True)
        return verdict
    where.mkdir(parents=True, exist_ok=True)
    (where / "pytest.log").write_bytes(bytes(log))
    (where / "seed.txt").write_text(f"{seed}\n{json.dumps(plan)}\nreplay: python scripts/stress.py --replay {seed}\n")
    return verdict


def tagged(tag: str) -> list[int]:
    """The processes of one run: every process whose environment carries its tag (ranks start sessions of their
    own, so a process group would miss them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"AIOCCL_STRESS_RUN={tag}".encode() in environ.split(b"\0"):
            found.append(int(entry))
    return found


def collect_stacks(tag: str, where: Path, spy: str | None) -> None:
    """Each live process of the run: its command line, Python and native stacks (py-spy, else gdb)."""
    for pid in tagged(tag):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        name = f"stacks-{'pytest-' if 'pytest' in cmdline.split()[:4] else ''}{pid}.txt"
        # py-spy's native unwinding fails on some frames (UNW_EBADREG): then its Python stacks, and gdb's
        tries = ([[spy, "dump", "--native", "--pid", str(pid)], [spy, "dump", "--pid", str(pid)]]
                 if spy and "python" in cmdline else [])
        tries.append(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"])
        text = ""
        for cmd in tries:
            try:
                got = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                text += f"$ {' '.join(cmd)}\n{got.stdout}{got.stderr}\n"
                if got.returncode == 0 and cmd[0] != "gdb" and "--native" in cmd:
                    break
            except (OSError, subprocess.TimeoutExpired) as e:
                text += f"$ {' '.join(cmd)}\ncould not dump: {e}\n"
        (where / name).write_text(f"$ {cmdline}\n\n{text}")


def stop_all(tag: str, proc: subprocess.Popen[bytes]) -> None:
    """Kill the run's processes (pytest's session and every rank that started a session of its own), then the
    shared-memory segments they can no longer remove."""
    for _ in range(3):
        pids = tagged(tag)
        if proc.poll() is None:
            pids.append(proc.pid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    proc.wait()
    for seg in Path("/dev/shm").glob("aioccl-*"):
        try:
            os.kill(int(seg.name.rsplit("-", 1)[-1]), 0)
        except ProcessLookupError:
            seg.unlink(missing_ok=True)
        except (ValueError, PermissionError):
            pass


if __name__ == "__main__":
    sys.exit(main())
