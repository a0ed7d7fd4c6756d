"""The socket path against its limits and against Gloo, in one run: 2 ranks, all_reduce, sockets forced.

    python benchmarks/socket_path.py --size 64M --repeats 5 --out docs/bench

Each repeat runs, in rotating order and in fresh processes:

- ``stream``: one TCP stream over loopback, a sender's ``sendall`` of the whole
  size into a receiver's ``recv_into`` (the "loopback TCP stream limit");
- ``exchange``: both processes send the size to each other at once and
  receive it, one thread each on nonblocking sockets (how an event-loop engine
  drives them). A 2-rank all_reduce moves exactly these bytes: half the
  buffer each way twice (reduce-scatter, then all-gather), plus a reduction;
- aioccl's all_reduce with ``AIOCCL_SHM_DISABLE=1`` and ``AIOCCL_NSOCKS`` 1, 2
  and 4 (``aioccl-perf``, in place, as compare.py runs it);
- Gloo's all_reduce (torch.distributed, as compare.py runs it).

Reports medians over repeats (each repeat itself a median of iterations),
busbw (for all_reduce on 2 ranks, size / time; for the stream, size / time),
and the ratios the targets name. Writes socket_path.json and socket_path.md.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare import run_aioccl, run_peer, versions  # noqa: E402

STREAMS = (1, 2, 4)


def _pair() -> tuple[socket.socket, int]:
    """(the connected socket, child pid): a TCP connection over loopback between this process and a fork."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    pid = os.fork()
    if pid == 0:
        s = socket.create_connection(srv.getsockname())
    else:
        s, _ = srv.accept()
    srv.close()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s, pid


def _barrier(s: socket.socket) -> None:
    s.setblocking(True)
    s.sendall(b"x")
    if s.recv(1) != b"x":
        raise RuntimeError("the peer process went away")


def raw(kind: str, nbytes: int, reps: int) -> float:
    """Median seconds of one ``stream`` (one way) or ``exchange`` (both ways at once) of ``nbytes``."""
    s, pid = _pair()
    buf_out, buf_in = memoryview(bytearray(nbytes)), memoryview(bytearray(nbytes))
    times = []
    for _ in range(reps):
        _barrier(s)
        t = time.perf_counter()
        if kind == "stream":
            if pid == 0:
                s.sendall(buf_out)
            else:
                got = 0
                while got < nbytes:
                    got += s.recv_into(buf_in[got:])
            _barrier(s)  # the sender's time ends when the receiver has it all
        else:
            _exchange(s, buf_out, buf_in)
        times.append(time.perf_counter() - t)
    s.close()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return statistics.median(times)


def _exchange(s: socket.socket, out: memoryview, into: memoryview) -> None:
    s.setblocking(False)
    sel = selectors.DefaultSelector()
    sent = got = 0
    n = len(out)
    while sent < n or got < n:
        moved = False
        if sent < n:
            try:
                sent += s.send(out[sent:])
                moved = True
            except BlockingIOError:
                pass
        if got < n:
            try:
                k = s.recv_into(into[got:])
                if k == 0:
                    raise RuntimeError("the peer process went away")
                got += k
                moved = True
            except BlockingIOError:
                pass
        if not moved:
            events = (selectors.EVENT_WRITE if sent < n else 0) | (selectors.EVENT_READ if got < n else 0)
            sel.register(s, events)
            sel.select(5.0)
            sel.unregister(s)
    sel.close()


def run_once(lib: str, nbytes: int) -> float:
    """Median microseconds of one library's (or one limit's) run."""
    if lib in ("stream", "exchange"):
        return raw(lib, nbytes, 20 if lib == "stream" else 9) * 1e6
    if lib == "gloo":
        rows = run_peer("gloo", "all_reduce", 2, [nbytes])
    else:
        rows = run_aioccl("aioccl-tcp", "all_reduce", 2, [nbytes], {"AIOCCL_NSOCKS": lib.rsplit("x", 1)[1]})
    if any(r["wrong"] for r in rows):
        raise RuntimeError(f"{lib}: wrong results")
    return float(rows[0]["median_us"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="64M")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="docs/bench")
    a = p.parse_args()
    from aioccl.tools.perf import parse_size

    nbytes = parse_size(a.size)
    libs = ["stream", "exchange", *(f"aioccl-tcp x{k}" for k in STREAMS), "gloo"]
    runs: dict[str, list[float]] = {lib: [] for lib in libs}
    for rep in range(a.repeats):
        for lib in libs[rep % len(libs):] + libs[:rep % len(libs)]:
            runs[lib].append(run_once(lib, nbytes))
            print(f"repeat {rep + 1}/{a.repeats} {lib:<14} {runs[lib][-1] / 1e3:8.2f} ms", flush=True)
    med = {lib: statistics.median(v) for lib, v in runs.items()}
    bw = {lib: nbytes / (us * 1e-6) / 1e9 for lib, us in med.items()}
    best = min((lib for lib in libs if lib.startswith("aioccl")), key=med.__getitem__)
    lines = [f"Command: `{' '.join(sys.argv)}`", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()), "",
             f"2 ranks (processes) on loopback, {nbytes} bytes; medians of {a.repeats} repeats.", "",
             "| run | ms | GB/s | runs (ms) |", "|---|---|---|---|"]
    for lib in libs:
        lines.append(f"| {lib} | {med[lib] / 1e3:.2f} | {bw[lib]:.2f} | "
                     + ", ".join(f"{x / 1e3:.1f}" for x in runs[lib]) + " |")
    x1 = "aioccl-tcp x1"
    lines += ["", f"- aioccl (1 stream) over Gloo: **{med['gloo'] / med[x1]:.2f}x**; the best stream count "
              f"({best}): {med['gloo'] / med[best]:.2f}x",
              f"- aioccl (1 stream) busbw over the one-stream limit: **{bw[x1] / bw['stream']:.0%}**",
              f"- time over a plain exchange of the same bytes: aioccl (1 stream) {med[x1] / med['exchange']:.2f}x, "
              f"Gloo {med['gloo'] / med['exchange']:.2f}x"]
    md = "\n".join(lines) + "\n"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "socket_path.json").write_text(json.dumps({"command": " ".join(sys.argv), "bytes": nbytes,
                                                      "runs_us": runs, "median_us": med}, indent=1))
    (out / "socket_path.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
