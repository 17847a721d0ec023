"""Only the optional C accelerators live here; everything else is in pyproject.toml.

``overlapviz.ingest._kineto`` scans Kineto trace JSON straight into column buffers
(~3x faster ingest); ``overlapviz.ingest._sqlite`` reads the SQLite formats' queries
(Nsight Systems, rocpd) straight into column buffers through the SQLite library Python's
own ``sqlite3`` loaded (resolved at run time: no SQLite headers or -lsqlite3 at build
time). Both are optional: without a C compiler the build goes on and ingest uses its
pure-Python paths, with the same results.
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "overlapviz.ingest._kineto",
            ["overlapviz/ingest/_kineto.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "overlapviz.ingest._sqlite",
            ["overlapviz/ingest/_sqlite.c"],
            extra_compile_args=["-O2"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],  # dlopen: in libc from glibc 2.34
            optional=True,
        ),
    ]
)
