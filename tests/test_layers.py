"""The house's layers hold: no import runs up the layer map, no import circle of more than 3 files, and
docs/architecture.md shows the map the contract holds the code to (tests/layers.py). Files have no size cap:
a file is one idea, split along its seams, never to meet a line count (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys

import layers
import pytest

from conftest import ROOT


def test_every_module_has_a_layer():
    for module in layers.modules(ROOT):
        layers.layer_of(module)  # KeyError names a module the map forgot


def test_no_import_runs_up_the_layers():
    assert layers.upward(layers.imports(ROOT)) == []


def test_no_import_circle_of_more_than_three_files():
    found = layers.circles(layers.imports(ROOT))
    assert found, "the reader finds no circle at all: it is reading nothing"
    assert all(len(c) <= 3 for c in found), [c for c in found if len(c) > 3]


def test_an_upward_import_is_caught(tmp_path):
    """The contract fails on a deliberately added upward import (at module level, in a function, for types)."""
    for pkg in layers.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "aioccl" / "communicator.py").write_text("from .errors import AiocclError\n")
    for body in ("from .communicator import Communicator\n",
                 "def f():\n    from . import communicator\n",
                 "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import aioccl.communicator\n"):
        (tmp_path / "aioccl" / "errors.py").write_text(body)
        graph = layers.imports(tmp_path)
        assert layers.upward(graph) == ["aioccl.errors (base) -> aioccl.communicator (communicator)"], body
        assert layers.circles(graph) == [["aioccl.communicator", "aioccl.errors"]]


def test_a_package_face_that_imports_counts_and_ones_own_package_does_not(tmp_path):
    pkg = tmp_path / "aioccl"
    (pkg / "engine").mkdir(parents=True)
    (tmp_path / "jax_ext").mkdir()
    (pkg / "__init__.py").write_text("from .communicator import Communicator\n")
    (pkg / "communicator.py").write_text("from .engine import op\n")
    (pkg / "engine" / "__init__.py").write_text('"""only a docstring"""\n')
    (pkg / "engine" / "op.py").write_text("from ..errors import E\nfrom . import view\n")
    (pkg / "engine" / "view.py").write_text("")
    (pkg / "errors.py").write_text("import aioccl.engine.view\n")
    graph = layers.imports(tmp_path)
    assert graph["aioccl.communicator"] == {"aioccl.engine.op"}  # engine/__init__ imports nothing
    assert graph["aioccl.engine.op"] == {"aioccl.errors", "aioccl.engine.view"}  # not aioccl/__init__: its own
    assert graph["aioccl.errors"] == {"aioccl.engine.view"}  # errors' own package: aioccl/__init__ ran first


def test_the_docs_show_the_contracts_map():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert layers.render() in doc, "docs/architecture.md's layer map differs from tests/layers.py:\n" + layers.render()


@pytest.mark.parametrize("pkg", ["aioccl", "jax_ext"])
def test_the_package_imports_alone(pkg):
    """Each package imports in a fresh interpreter (no circle hidden by import order)."""
    p = subprocess.run([sys.executable, "-c", f"import {pkg}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_the_native_core_stands_in_two_layers():
    """core/ includes nothing of py/ and not Python's headers; py/ may include core/; no include circle."""
    graph = layers.native_includes(ROOT)
    assert any(u.startswith("core/") for u in graph) and any(u.startswith("py/") for u in graph)
    for unit, targets in graph.items():
        if unit.startswith("core/"):
            assert "Python.h" not in targets and not any(t.startswith("py/") for t in targets), (unit, targets)
    assert [c for c in layers.circles({u: t - {"Python.h"} for u, t in graph.items()})] == []


def test_each_native_layer_has_its_symbol_prefix():
    """Every function and global a native file defines outside itself (not static) carries its layer's prefix."""
    import re

    bad = []
    # a definition at file level that is not static: its name, before "(", "=", ";" or "["
    definition = re.compile(r"^(?!static|typedef|enum|struct|#|\s|}|extern)[A-Za-z_][\w \*]*?\b(\w+)\s*[(=;\[]",
                            re.M)
    for layer, paths in layers.native_units(ROOT).values():
        for p in paths:
            if p.suffix != ".c":
                continue
            text = re.sub(r"/\*.*?\*/", "", p.read_text(), flags=re.S)
            for m in definition.finditer(text):
                name = m.group(1)
                if not name.startswith(layers.NATIVE_PREFIX[layer]):
                    bad.append(f"{p.relative_to(ROOT)}: {name}")
    assert bad == []


def test_the_integrations_use_the_low_level_surface_not_privates():
    """jax_ext, interop and the tools reach a Communicator's or a Work's private names only through
    aioccl.lowlevel (as trio's integrations use trio.lowlevel)."""
    import ast
    import inspect

    from aioccl import Communicator, Work

    private = {name for cls in (*Communicator.__mro__, *Work.__mro__) if cls.__module__.startswith("aioccl")
               for name in (*vars(cls), *getattr(cls, "__slots__", ()))
               if name.startswith("_") and not name.startswith("__")}
    heap_type = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class written in Python (Work's base may be the core's, in C)
    for cls in (*Communicator.__mro__, *Work.__mro__):  # and what their methods set on self
        if cls.__module__.startswith("aioccl") and cls.__flags__ & heap_type:
            tree = ast.parse(inspect.getsource(cls))
            private |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                        and n.value.id == "self" and n.attr.startswith("_") and not n.attr.startswith("__")}
    assert {"_engine", "_state", "_cpu", "_door", "_start", "_set_result", "_retrieved"} <= private
    files = [p for d in ("jax_ext", "aioccl/interop", "aioccl/tools") for p in (ROOT / d).rglob("*.py")]
    reached = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in private
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                reached.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert reached == []


def _type_checking_blocks(tree: ast.AST) -> list[ast.If]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]


# a class typing a method of its own that its C base implements: not another class's member
OWN_TYPING = {("aioccl/work.py", "__await__")}


def test_no_type_checking_block_declares_members():
    """An ``if TYPE_CHECKING:`` block imports types, nothing more: a part that needs another object's members
    is given that object (composition), it does not re-declare them."""
    found = []
    for pkg in layers.PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(p.relative_to(ROOT))
            for block in _type_checking_blocks(ast.parse(p.read_text())):
                for st in block.body:
                    name = getattr(st, "name", None)
                    if not isinstance(st, (ast.Import, ast.ImportFrom)) and (rel, name) not in OWN_TYPING:
                        found.append(f"{rel}:{st.lineno} {ast.unparse(st).splitlines()[0]}")
    assert found == []


def test_the_communicator_and_the_mailbox_inherit_from_no_class_of_ours():
    """Composition, not mixins: each holds its parts (docs/architecture.md)."""
    from aioccl.communicator import Communicator
    from aioccl.engine.mailbox import Mailbox

    for cls in (Communicator, Mailbox):
        assert cls.__bases__ == (object,), (cls, cls.__bases__)
