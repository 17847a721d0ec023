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
    ("overlapviz.lifetime", set()),  # children that die with their parent; signals held while they start
    ("overlapviz.dataset", {"overlapviz._version"}),  # the Arrow schema, the Parquet layout, the directory on disk
    ("overlapviz.domain", {"overlapviz.dataset"}),  # vocabulary, collective names, devices, derived columns
    ("overlapviz.ingest", {"overlapviz._version", "overlapviz.lifetime", "overlapviz.dataset", "overlapviz.domain"}),
    ("overlapviz.analysis", {"overlapviz.dataset", "overlapviz.domain"}),
    ("overlapviz.figures", {"overlapviz.dataset", "overlapviz.domain", "overlapviz.analysis"}),
    ("overlapviz.export", {"overlapviz.dataset", "overlapviz.domain", "overlapviz.analysis", "overlapviz.figures"}),
    ("overlapviz.distributed", {"overlapviz", "overlapviz.dataset", "overlapviz.domain", "overlapviz.ingest",
                                "overlapviz.analysis", "overlapviz.figures"}),
    ("overlapviz.api", {"overlapviz.dataset", "overlapviz.ingest", "overlapviz.analysis", "overlapviz.figures",
                        "overlapviz.export", "overlapviz.distributed"}),
    ("overlapviz.collectors", {"overlapviz.lifetime", "overlapviz.dataset", "overlapviz.ingest", "overlapviz.analysis"}),
    ("overlapviz.dashboards", {"overlapviz", "overlapviz.dataset", "overlapviz.domain", "overlapviz.ingest",
                               "overlapviz.analysis", "overlapviz.figures", "overlapviz.export", "overlapviz.distributed",
                               "overlapviz.testing"}),  # soak.py builds its traces with overlapviz.testing
    ("overlapviz.cli", {"overlapviz._version", "overlapviz.lifetime", "overlapviz.dataset", "overlapviz.domain",
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
    assert flat == ["__init__.py", "__main__.py", "_version.py", "api.py", "lifetime.py", "testing.py"], flat


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
