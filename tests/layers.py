"""The layer contract: every package and top-level module of aioccl and jax_ext, with its layer.

A module may import modules of its own layer and of the layers below it, never above. docs/architecture.md
shows the same map (``test_layers.py`` holds the two together). Imports are read from the source: at
module level, inside functions and under ``TYPE_CHECKING`` alike, for a type is a dependency too.
"""

from __future__ import annotations

import ast
from pathlib import Path

# bottom first; each entry a dotted name: a package stands for everything under it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("aioccl.errors", "aioccl.log", "aioccl.envvars", "aioccl.dtypes", "aioccl.environment",
              "aioccl.error_file", "aioccl.algorithms", "aioccl.kernels", "aioccl.native", "aioccl.tuning",
              "aioccl.topology")),
    ("wires", ("aioccl.bootstrap", "aioccl.transport")),
    # gpu/'s face, probe.py and arrays.py are how buffers.py views device memory (cupy is not imported):
    # they stand with buffers; the rest of gpu/ (the device path, the runner, the lane) above the engine
    ("handles", ("aioccl.placement", "aioccl.async_libs", "aioccl.work", "aioccl.group", "aioccl.buffers",
                 "aioccl.tensors", "aioccl.introspection", "aioccl.gpu.__init__", "aioccl.gpu.probe",
                 "aioccl.gpu.arrays")),
    ("engine", ("aioccl.engine", "aioccl.watchdog", "aioccl.state")),
    ("gpu", ("aioccl.gpu",)),
    ("communicator", ("aioccl.communicator", "aioccl.collectives", "aioccl.p2p", "aioccl.lanes", "aioccl.launch",
                      "aioccl.lifecycle", "aioccl.tracking", "aioccl.planning", "aioccl.recovery", "aioccl.knobs",
                      "aioccl.initialization", "aioccl.lowlevel")),
    ("top", ("aioccl", "aioccl.interop", "aioccl.ray", "aioccl.tools", "aioccl.run", "jax_ext")),
)
PACKAGES = ("aioccl", "jax_ext")


def modules(root: Path) -> dict[str, Path]:
    """Every module of the packages: its dotted name (a package's ``__init__`` as ``pkg.__init__``) -> file."""
    out = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            out[".".join(p.relative_to(root).with_suffix("").parts)] = p
    return out


def layer_of(module: str) -> int:
    """The layer of a module: its longest entry in ``LAYERS`` (``aioccl`` alone is the package's face; an
    entry ``pkg.__init__`` places a package's face apart from the package)."""
    name = module.removesuffix(".__init__")
    best, depth = -1, -1
    for i, (_label, names) in enumerate(LAYERS):
        for entry in names:
            exact = name == entry or module == entry
            under = name.startswith(entry + ".") and entry != "aioccl"
            if (exact or under) and len(entry) > depth:
                best, depth = i, len(entry)
    if best < 0:
        raise KeyError(f"{module} has no layer in tests/layers.py")
    return best


def imports(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the packages it imports (anywhere in it). ``from p import m`` imports the
    module ``p.m`` when there is one, else ``p`` itself; importing ``a.b`` also counts as importing the
    package ``a`` when its ``__init__`` imports something and ``a`` is not the importer's own package (which
    Python has imported before the importer runs)."""
    files = modules(root)

    def resolve(name: str) -> str | None:
        return name if name in files else name + ".__init__" if name + ".__init__" in files else None

    busy = {m for m, p in files.items() if m.endswith(".__init__")
            and any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(ast.parse(p.read_text())))}
    graph: dict[str, set[str]] = {}
    for m, path in files.items():
        own = m.removesuffix(".__init__") if m.endswith(".__init__") else m.rpartition(".")[0]
        found: set[str] = set()
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                if n.level:
                    base = own.split(".")[: len(own.split(".")) - (n.level - 1)]
                    mod = ".".join(base + ([n.module] if n.module else []))
                else:
                    mod = n.module or ""
                subs = [f"{mod}.{a.name}" for a in n.names]
                names = [s for s in subs if resolve(s)] + ([mod] if not all(resolve(s) for s in subs) else [])
            else:
                continue
            for name in names:
                if not name.startswith(PACKAGES):
                    continue
                target = resolve(name)
                if target is not None:
                    found.add(target)
                parts = name.split(".")
                for i in range(1, len(parts)):
                    anc = ".".join(parts[:i])
                    if own == anc or own.startswith(anc + "."):
                        continue
                    if anc + ".__init__" in busy:
                        found.add(anc + ".__init__")
        found.discard(m)
        graph[m] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    part = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        part.append(w)
                        if w == v:
                            break
                    if len(part) > 1:
                        out.append(sorted(part))
    return sorted(out, key=len, reverse=True)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a layer to one above it, as 'a (layer) -> b (layer)'."""
    names = [label for label, _ in LAYERS]
    bad = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            if layer_of(t) > layer_of(m):
                bad.append(f"{m} ({names[layer_of(m)]}) -> {t} ({names[layer_of(t)]})")
    return bad


def render() -> str:
    """The map as docs/architecture.md shows it: top layer first."""
    return "\n".join(f"{label:>12}: {', '.join(names)}" for label, names in reversed(LAYERS))


# -- the native core's two layers (aioccl/native/src): core/ is pure C, py/ the CPython layer above it --
NATIVE = ("core", "py")  # bottom first
NATIVE_PREFIX = {"core": ("ac_",), "py": ("acpy_", "PyInit_")}


def native_units(root: Path) -> dict[str, tuple[str, list[Path]]]:
    """'layer/name' -> (its layer, its files): a .c and its .h are one unit."""
    units: dict[str, tuple[str, list[Path]]] = {}
    for layer in NATIVE:
        for p in sorted((root / "aioccl" / "native" / "src" / layer).glob("*.[ch]")):
            units.setdefault(f"{layer}/{p.stem}", (layer, []))[1].append(p)
    return units


def native_includes(root: Path) -> dict[str, set[str]]:
    """unit -> the units it includes (a header of its own folder, or 'core/x.h' from py/), and 'Python.h'
    when it includes Python's header."""
    import re

    units = native_units(root)
    out: dict[str, set[str]] = {}
    for name, (layer, paths) in units.items():
        found = set()
        for p in paths:
            for inc in re.findall(r'^#include [<"]([^>"]+)[>"]', p.read_text(), re.M):
                if inc in ("Python.h", "structmember.h") or inc.startswith("numpy/"):
                    found.add("Python.h")
                    continue
                target = inc.removesuffix(".h") if "/" in inc else f"{layer}/{inc.removesuffix('.h')}"
                if target in units and target != name:
                    found.add(target)
        out[name] = found
    return out
