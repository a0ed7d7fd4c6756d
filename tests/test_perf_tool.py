"""aioccl-perf: nccl-tests' sizes, counts and formulas; every op run for real with checks, JSON and plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from aioccl.tools import perf
from aioccl.tools.perf_cases import busbw_factor, reduced, values, wrong

from conftest import ROOT


def run_perf(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOCCL_")}
    return subprocess.run([sys.executable, "-m", "aioccl.tools.perf", *args], env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout)


def rows(out: str) -> list[list[str]]:
    return [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]


def test_sizes_like_nccl_tests():
    assert perf.sizes(perf.parse_args(["all_reduce", "-b", "8", "-e", "64", "-f", "2"])) == [8, 16, 32, 64]
    assert perf.sizes(perf.parse_args(["all_reduce", "-b", "1K", "-e", "4K", "-i", "1K"])) == [1024, 2048, 3072, 4096]
    assert perf.sizes(perf.parse_args(["all_reduce", "--sizes", "8,1M,64M"])) == [8, 1 << 20, 64 << 20]
    assert perf.parse_size("64M") == 64 << 20 and perf.parse_size("1.5K") == 1536
    assert perf.parse_args(["all_reduce", "-d", "half"]).dtype == np.dtype(np.float16)


@pytest.mark.parametrize("bad", [["all_reduce", "-d", "complex64"], ["all_reduce", "-o", "avg", "-d", "int32"],
                                 ["all_reduce", "-b", "64", "-e", "8"], ["nosuchop"], ["all_reduce", "-n", "0"]])
def test_bad_arguments_exit_2(bad):
    p = run_perf(*bad)
    assert p.returncode == 2 and "error" in p.stderr


def test_busbw_factors_are_nccl_tests():
    assert busbw_factor("all_reduce", 4) == 1.5
    assert busbw_factor("all_gather", 4) == busbw_factor("reduce_scatter", 4) == busbw_factor("all_to_all", 4) == 0.75
    assert busbw_factor("broadcast", 4) == busbw_factor("reduce", 4) == busbw_factor("sendrecv", 4) == 1.0


def test_wrong_counts_elements_bit_for_bit():
    want = values(0, 10, np.dtype(np.float32), "sum")
    got = want.copy()
    assert wrong(got, want) == 0
    got[3] = np.nan
    got[7] = -0.0 if want[7] == 0 else want[7] + 1
    assert wrong(got, want) == 2
    bf = values(1, 5, np.dtype(ml_dtypes.bfloat16), "prod")
    assert wrong(bf, bf.copy()) == 0
    assert (reduced(3, 4, np.dtype(np.int8), "max") == np.max([values(r, 4, np.int8, "max") for r in range(3)],
                                                               axis=0)).all()


@pytest.mark.parametrize("op,extra", [
    ("all_reduce", ["-o", "avg", "-d", "bfloat16"]), ("all_gather", ["-d", "int8"]),
    ("reduce_scatter", ["-o", "min"]), ("broadcast", ["-r", "2"]), ("reduce", ["-r", "1", "-o", "prod"]),
    ("all_to_all", ["-d", "float64"]), ("sendrecv", []),
])
def test_every_op_runs_checks_and_reports(op, extra, tmp_path):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    p = run_perf(op, "-b", "8", "-e", "128K", "-f", "16", "-n", "3", "-w", "1", "--np", "3",
                 "--json", str(js), "--plot", str(png), *extra)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    table = rows(p.stdout)
    # 8 B of a block-wise op has no element per rank at 3 ranks: skipped, as nccl-tests does
    assert len(table) >= 3 and all(r[8] == "0" for r in table), p.stdout  # column 8: out-of-place #wrong
    assert "# Out of bounds values : 0 OK" in p.stdout
    report = json.loads(js.read_text())
    assert report["op"] == op and report["nranks"] == 3 and report["wrong"] == 0
    assert report["busbw_factor"] == busbw_factor(op, 3)
    for row in report["rows"]:
        oop = row["out_of_place"]
        assert oop["busbw"] == pytest.approx(oop["algbw"] * report["busbw_factor"])
        assert oop["algbw"] == pytest.approx(row["bytes"] / (oop["time_us"] * 1e-6) / 1e9)
        assert ("in_place" in row) == (op != "sendrecv")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_bar_when_asked():
    p = run_perf("all_reduce", "-b", "8", "-e", "64", "-f", "2", "-n", "2", "-w", "0", "--np", "2", "--progress")
    assert p.returncode == 0 and "sizes" in p.stderr and "[" in p.stderr
    assert len(rows(p.stdout)) == 4
