"""Only the optional C accelerator lives here; everything else is in pyproject.toml.

``overlapviz.ingest._kineto`` scans Kineto trace JSON straight into column buffers
(~3x faster ingest). It is optional: without a C compiler the build goes on and ingest
uses its pure-Python reader (msgspec), with the same results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "overlapviz.ingest._kineto",
            ["overlapviz/ingest/_kineto.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
