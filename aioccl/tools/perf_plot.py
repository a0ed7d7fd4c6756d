"""busbw against size, log axes, from an ``aioccl-perf`` report (matplotlib, imported only here)."""

from __future__ import annotations

from typing import Any


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
        pts = [(row["bytes"], row[key]["busbw"]) for row in report["rows"] if key in row]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"aioccl {report['op']} {report['dtype']}, {report['nranks']} ranks, engine {report['engine']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
