"""The GPU all_reduce figure of docs/benchmarks.md from the aioccl-perf reports in docs/bench/gpu/.

    python benchmarks/gpu_plot.py [--copy-tbs 4.14] [--out docs/img/gpu_all_reduce.png]

busbw against size: 2 ranks with MPS (the median of the runs ``perf_np2_mpson_*.json``), 4 ranks with MPS,
2 ranks without; with the byte-count limit of the kernel's scheme on user buffers at 2 ranks (each rank
copies its input in, reads every rank's copy and writes the result: 10 x the size moved across the GPU, at
the device-to-device copy rate measured in the same session).
"""

from __future__ import annotations

import argparse
import glob
import json
import pathlib
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(paths: list[str]) -> tuple[list[int], list[float]]:
    reports = [json.loads(pathlib.Path(p).read_text()) for p in sorted(paths)]
    sizes = [row["bytes"] for row in reports[0]["rows"]]
    busbw = [statistics.median(r["rows"][k]["out_of_place"]["busbw"] for r in reports) for k in range(len(sizes))]
    return sizes, busbw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="docs/bench/gpu")
    ap.add_argument("--copy-tbs", type=float, default=4.14, help="device-to-device copy rate, TB/s (read+write)")
    ap.add_argument("--out", default="docs/img/gpu_all_reduce.png")
    ns = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pattern, label in (("perf_np2_mpson_*.json", "2 ranks, MPS (median of 3 runs)"),
                           ("perf_np4_mpson.json", "4 ranks, MPS"), ("perf_np2_mpsoff.json", "2 ranks, no MPS")):
        paths = glob.glob(f"{ns.dir}/{pattern}")
        if paths:
            ax.plot(*series(paths), marker="o", label=label)
    ax.axhline(ns.copy_tbs * 1e3 / 10, color="grey", linestyle="--",
               label=f"limit, 2 ranks, user buffers ({ns.copy_tbs * 100:.0f} GB/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("aioccl all_reduce float32 on GPU buffers, one H200 shared by the ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(ns.out, dpi=110)


if __name__ == "__main__":
    main()
