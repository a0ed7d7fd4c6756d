"""Predicted busbw against size: one panel per rank count, one line per algorithm, the tuner's pick marked."""

from __future__ import annotations

from typing import Any


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r["ranks"] for r in report["rows"]})
    fig, axes = plt.subplots(1, len(ranks), figsize=(3.6 * len(ranks), 3.6), sharey=True, squeeze=False)
    for ax, n in zip(axes[0], ranks, strict=True):
        rows = [r for r in report["rows"] if r["ranks"] == n]
        for algo in rows[0]["algos"]:
            ax.plot([r["bytes"] for r in rows], [r["algos"][algo]["busbw"] for r in rows], marker=".", label=algo)
        ax.scatter([r["bytes"] for r in rows], [r["algos"][r["tuner"]]["busbw"] for r in rows], s=80,
                   facecolors="none", edgecolors="black", label="tuner")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{n} ranks")
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("predicted busbw (GB/s)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"aioccl-sim {report['coll']} on {report['link']['name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
