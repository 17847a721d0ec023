"""pyarrow without pandas: the first ``pa.array`` / ``pa.scalar`` does not import it (imported once by ``schema``)."""

from __future__ import annotations

import importlib.abc
import sys

import pyarrow as pa

# pyarrow imports pandas (when installed) the first time pa.array or pa.scalar runs, to
# ask whether its argument is a pandas object: ~50 MB and ~0.4 s that `ingest` and
# `analyze` do not need. While pandas is not imported, let that first probe find no
# pandas; the moment anyone imports pandas, tell pyarrow (as its first to_pandas would),
# so pandas objects made afterwards convert exactly as without this.


class _PandasImportWatch(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """On ``import pandas``: load it as usual, then let pyarrow's pandas shim find it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "pandas":
            return None
        _unwatch()
        for finder in sys.meta_path:  # the finders that would have found it
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        shim = getattr(pa.lib, "_pandas_api", None)
        if shim is not None:
            _ = shim.pd  # pyarrow re-checks for pandas: found now, and remembered


def _unwatch() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PandasImportWatch)]


def defer_pandas_in_pyarrow() -> None:
    if "pandas" in sys.modules or any(isinstance(f, _PandasImportWatch) for f in sys.meta_path):
        return
    if not hasattr(type(getattr(pa.lib, "_pandas_api", None)), "pd"):  # on the class: not the getter
        return  # a pyarrow whose shim this does not know: leave it alone (it imports pandas)
    block = _NoPandas()
    sys.meta_path.insert(0, block)  # an ImportError for pyarrow's one probe
    try:
        pa.scalar(0)
    finally:
        sys.meta_path.remove(block)
    sys.meta_path.insert(0, _PandasImportWatch())


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "pandas":
            raise ModuleNotFoundError("pandas is not imported for pyarrow's probe", name=fullname)
