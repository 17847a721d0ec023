"""The package's layers stay visible: data flows ingest -> dataset (schema) -> analysis -> figures -> dashboards/CLI.

Read from the source (every import, those inside functions too), so a lazy import cannot
hide a dependency: each layer imports only layers before it, no module imports in a cycle,
and no module grows past ~800 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# overlapviz.<sub> -> the directory it is installed from (pyproject's package-dir)
PACKAGE_DIRS = {
    "overlapviz": ROOT / "overlapviz",
    "overlapviz.collectors": ROOT / "collectors",
    "overlapviz.dashboards": ROOT / "dashboards",
}
MAX_LINES = 800

# The layers in the order data flows; each may import only the layers listed as its inputs (besides itself).
# A module belongs to the first prefix it matches, and every module must match one (test below).
LAYERS = [
    ("overlapviz._version", set()),
    ("overlapviz._extras", set()),  # the optional extras commands check for (pyproject.toml)
    ("overlapviz.lifetime", set()),  # children that die with their parent; signals held while they start
    ("overlapviz.dataset", {"overlapviz._version"}),  # the Arrow schema, the Parquet layout, the directory on disk
    ("overlapviz.domain", {"overlapviz.dataset"}),  # vocabulary, collective names, devices, derived columns
    ("overlapviz.ingest", {"overlapviz._version", "overlapviz.lifetime", "overlapviz.dataset", "overlapviz.domain"}),
    ("overlapviz.analysis", {"overlapviz.dataset", "overlapviz.domain"}),
    ("overlapviz.figures", {"overlapviz.dataset", "overlapviz.domain", "overlapviz.analysis"}),
    ("overlapviz.export", {"overlapviz.dataset", "overlapviz.domain", "overlapviz.analysis", "overlapviz.figures"}),
    ("overlapviz.distributed", {"overlapviz", "overlapviz.dataset", "overlapviz.domain", "overlapviz.ingest",
                                "overlapviz.analysis", "overlapviz.figures"}),
    ("overlapviz.api", {"overlapviz._extras", "overlapviz.dataset", "overlapviz.ingest", "overlapviz.analysis", "overlapviz.figures",
                        "overlapviz.export", "overlapviz.distributed"}),
    ("overlapviz.collectors", {"overlapviz.lifetime", "overlapviz.dataset", "overlapviz.ingest", "overlapviz.analysis"}),
    ("overlapviz.dashboards", {"overlapviz", "overlapviz.lifetime", "overlapviz.dataset", "overlapviz.domain", "overlapviz.ingest",
                               "overlapviz.analysis", "overlapviz.figures", "overlapviz.export", "overlapviz.distributed",
                               "overlapviz.testing"}),  # soak.py builds its traces with overlapviz.testing
    ("overlapviz.cli", {"overlapviz._version", "overlapviz._extras", "overlapviz.lifetime", "overlapviz.dataset", "overlapviz.domain",
                        "overlapviz.ingest", "overlapviz.analysis", "overlapviz.figures", "overlapviz.export",
                        "overlapviz.distributed", "overlapviz.api", "overlapviz.collectors", "overlapviz.dashboards"}),
    ("overlapviz.testing", {"overlapviz.dataset", "overlapviz.cli"}),  # trace builders; runs the CLI in process
    ("overlapviz.__main__", {"overlapviz.cli"}),
    ("overlapviz", {"overlapviz._version", "overlapviz.api"}),  # the package itself: overlapviz.open
]


def _modules() -> dict[str, Path]:
    found = {}
    for pkg, directory in PACKAGE_DIRS.items():
        for path in directory.rglob("*.py"):
            rel = path.relative_to(directory).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([pkg, *parts])] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The overlapviz modules ``name`` imports anywhere in its source (a ``from X import y``
    counts as importing ``X.y`` where that is a module, else ``X``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                here = name.split(".") if is_pkg else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t.split(".")[0] == "overlapviz")
    out.discard(name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> tuple[str, set[str]] | None:
    for prefix, allowed in LAYERS:
        if module == prefix or (prefix != "overlapviz" and module.startswith(prefix + ".")):
            return prefix, allowed
    return None


def test_every_module_is_in_a_layer():
    assert not sorted(m for m in MODULES if _layer(m) is None), "modules no layer of LAYERS places: add them"


def test_no_module_sits_beside_the_layers():
    # the package's top level holds only its facade and the layers' folders
    flat = sorted(p.name for p in PACKAGE_DIRS["overlapviz"].glob("*.py"))
    assert flat == ["__init__.py", "__main__.py", "_extras.py", "_version.py", "api.py", "lifetime.py", "testing.py"], flat


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_layer_imports_only_the_layers_before_it(module):
    prefix, allowed = _layer(module)
    bad = sorted(
        t for t in GRAPH[module]
        if not (t == prefix or (prefix != "overlapviz" and t.startswith(prefix + "."))) and not any(t == a or t.startswith(a + ".") for a in allowed - {"overlapviz"})
        and t != "overlapviz"
    )  # fmt: skip
    assert not bad, f"{module} ({MODULES[module].relative_to(ROOT)}) imports {bad}, outside its layer's inputs"


def test_analysis_imports_no_reader_figure_dashboard_or_cli():
    offenders = {
        m: sorted(t for t in deps if t.startswith(("overlapviz.ingest", "overlapviz.figures.charts", "overlapviz.dashboards",
                                                    "overlapviz.cli", "overlapviz.export.render", "overlapviz.collectors")))
        for m, deps in GRAPH.items() if m.startswith("overlapviz.analysis")
    }  # fmt: skip
    assert not {m: t for m, t in offenders.items() if t}


def test_no_module_imports_in_a_cycle():
    # Tarjan's strongly connected components over the import graph
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"modules importing each other in a cycle: {cycles}"


def test_the_checks_see_a_cycle_and_a_layer_breach(tmp_path):
    # the graph builder itself: a module importing a later layer, and two that import each other
    a = tmp_path / "a.py"
    a.write_text("from overlapviz.figures.charts import timeline\nimport overlapviz.ingest.driver\n")
    deps = _imports("overlapviz.analysis.fake", a)
    assert {"overlapviz.figures.charts", "overlapviz.ingest.driver"} <= deps
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from overlapviz.ingest import pool\n")
    assert "overlapviz.ingest.pool" in _imports("overlapviz.ingest.fake", b)
    # a module beside the layers is placed in none, and the package root is not a prefix of every module
    assert _layer("overlapviz.newthing") is None and _layer("overlapviz.ingest.x")[0] == "overlapviz.ingest"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_800_lines(module):
    n = len(MODULES[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {n} lines (split it by job)"


def _private_uses(name: str, path: Path) -> list[str]:
    """The private names (one leading underscore) of other overlapviz modules that ``name`` uses:
    ``from overlapviz.x import _y``, and ``m._y`` / ``overlapviz.x._y`` where ``m`` names a module of
    the package. A private module (``cli._table``, the C scanner ``ingest._kineto``) is its
    package's: the modules under that package may import it; a private name in a module is that
    module's alone."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"

    def private(n: str) -> bool:
        return n.startswith("_") and not n.startswith("__")

    def outside(module: str) -> bool:  # a private module ``pkg._m`` (or a module under it) seen from outside ``pkg``
        parts = module.split(".")
        return any(private(p) and not (name + ".").startswith(".".join(parts[:i]) + ".") for i, p in enumerate(parts) if i)

    modules, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(here[: len(here) - (node.level - 1)] + ([base] if base else []))
            if base.split(".")[0] != "overlapviz" or base == name:
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                # a module, or a C extension (ingest._kineto, built from its .c beside it)
                is_module = full in MODULES or ROOT.joinpath(*full.split(".")).with_suffix(".c").exists()
                if is_module:
                    modules[a.asname or a.name] = full
                    if outside(full):
                        found.append(full)
                elif private(a.name):
                    found.append(full)
            if outside(base):
                found.append(base)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "overlapviz":
                    if a.asname:
                        modules[a.asname] = a.name
                    if outside(a.name):
                        found.append(a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain, v = [], node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name):
                owner = ".".join([modules.get(v.id, v.id), *reversed(chain)])
                if owner in MODULES and owner != name:
                    found.append(f"{owner}.{node.attr}")
    return sorted(set(found))


def test_no_private_name_is_used_across_modules():
    # what another module needs is public, with a docstring: a private name is its module's to change
    used = sorted(f"{m} uses {u}" for m, p in MODULES.items() for u in _private_uses(m, p))
    assert not used, f"{len(used)} private names used across modules (make them public):\n" + "\n".join(used)


def test_the_check_sees_private_names_across_modules(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("from overlapviz.ingest.driver import _ingest_file, ingest\nfrom overlapviz.analysis import explain\n"
                 "import overlapviz.distributed.cluster as cl\nimport overlapviz.ingest.pool\n"
                 "def f():\n    return explain._explain_rank, cl._key, overlapviz.ingest.pool._x, explain.__doc__, explain.KEYS\n")  # fmt: skip
    assert _private_uses("overlapviz.distributed.fake", a) == [
        "overlapviz.analysis.explain._explain_rank", "overlapviz.distributed.cluster._key",
        "overlapviz.ingest.driver._ingest_file", "overlapviz.ingest.pool._x"]  # fmt: skip
    # a private module is its package's: its siblings may import it, a module outside may not
    b = tmp_path / "b.py"
    b.write_text("from overlapviz.cli._table import render\nfrom overlapviz.ingest import _kineto\n")
    assert _private_uses("overlapviz.cli.fake", b) == ["overlapviz.ingest._kineto"]
    assert _private_uses("overlapviz.ingest.fake", b) == ["overlapviz.cli._table"]
    # a module's own private names, and names it merely calls private, are its own
    c = tmp_path / "c.py"
    c.write_text("from overlapviz.figures.raster import coverage as _coverage\nfrom overlapviz import __version__\n")
    assert _private_uses("overlapviz.distributed.fake", c) == []


def test_no_test_module_imports_another():
    # shared helpers live in tests/conftest.py, tests/_*.py or overlapviz.testing: a test module imported by another
    # runs its module-level code twice and couples the two files' fixtures
    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not found, found
