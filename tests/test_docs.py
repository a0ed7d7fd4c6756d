"""The docs site builds with warnings as errors, and every code block of the getting-started page runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

BLOCK = re.compile(r'^```(\w+)([^\n]*)\n(.*?)^```', re.S | re.M)
BIN = Path(sys.executable).parent


def env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AIOCCL_")}, "PYTHONPATH": str(ROOT),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_MKDOCS_2_WARNING": "1"}


def test_site_builds_strict(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "WARNING" not in p.stderr, p.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "aioccl" / "index.html").read_text()
    for member in ("aioccl.Communicator.all_reduce", "aioccl.Work.wait", "aioccl.errors.PeerLost"):
        assert f'id="{member}"' in reference, f"{member} missing from the generated API reference"
    assert (tmp_path / "site" / "bench" / "compare_all_reduce.png").exists()
    jax_page = (tmp_path / "site" / "reference" / "jax_ext" / "index.html").read_text()
    for page in (reference, jax_page):
        text = re.sub(r"<[^>]+>", "", page)
        assert not re.search(r":(meth|class|func|attr|exc|mod):", text), "a raw Sphinx role in the reference"
        assert "jax_ext.all_reduce.all_reduce" not in text  # headings show the public names
    for member in ("SUM", "PROD", "MIN", "MAX", "AVG"):
        assert f'id="aioccl.ReduceOp.{member}"' in reference, f"ReduceOp.{member} is not listed"
    start = reference.rindex('data-md-component="toc"')  # the page's table of contents (the right sidebar)
    toc = reference[start:reference.index("md-content", start)]
    for name in ("Communicator", "Work"):  # once each: no section heading of the same name above the object
        assert toc.count(f'href="#aioccl.{name}"') == 1 and f'href="#{name.lower()}"' not in toc, name


def test_doc_sources_hold_no_control_characters():
    for path in [*(ROOT / "docs").rglob("*.md"), *(ROOT / "docs").rglob("*.json"), ROOT / "README.md"]:
        text = path.read_text()
        bad = [c for c in set(text) if ord(c) < 32 and c not in "\n\t"] + [e for e in ("\\u0000",) if e in text]
        assert not bad, f"{path.relative_to(ROOT)} holds {bad!r}"


def test_every_getting_started_block_runs(tmp_path):
    page = (ROOT / "docs" / "getting-started.md").read_text()
    blocks = BLOCK.findall(page)
    ran = []
    for lang, info, body in blocks:
        title = re.search(r'title="([^"]+)"', info)
        if lang == "python" and title:
            (tmp_path / title.group(1)).write_text(body)  # run by a later command block
            continue
        if lang == "python":
            cmds = [[sys.executable, "-c", body]]
        else:
            assert lang == "sh", f"unexpected block language {lang}"
            lines = [ln.split("#")[0].strip() for ln in body.splitlines()]
            # `make demo` / `make test` are the set-up itself: CI runs them, a test cannot
            cmds = [["bash", "-c", ln] for ln in lines if ln and not ln.startswith("make ")]
        for cmd in cmds:
            p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env())
            assert p.returncode == 0, f"{cmd[-1][:200]}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
            ran.append(p.stdout)
    out = "\n".join(ran)
    assert "[rank 1] rank 1/2: sum 3, from rank 0: [0, 0]" in out
    assert "[rank 0] rank 0/2: sum 3, from rank 1: [1, 10]" in out
    assert "both ranks gathered [0, 0, 1, 1]" in out
    assert "[rank 2] rank 2: [0, 1, 2]" in out
    assert "transport shm: available" in out and "environment (* = set):" in out
    assert "[rank 0] pairs (row: from rank, column: to rank):" in out and "[rank 0]     0 self  shm" in out
    assert len(ran) == 5, len(ran)  # two aioccl-run lines, the in-process program, aioccl-info, its topology


def test_every_package_has_a_readme_naming_each_of_its_modules():
    for init in [*(ROOT / "aioccl").rglob("__init__.py"), ROOT / "jax_ext" / "__init__.py"]:
        pkg = init.parent
        readme = pkg / "README.md"
        assert readme.exists(), f"{pkg.relative_to(ROOT)} has no README.md"
        text = readme.read_text()
        names = [p.stem for p in pkg.glob("*.py") if p.name != "__init__.py"]
        names += [p.parent.name for p in pkg.glob("*/__init__.py")]
        missing = [n for n in names if not re.search(rf"\b{re.escape(n)}\b", text)]
        assert not missing, f"{readme.relative_to(ROOT)} does not mention {missing}"
