"""The one thing pyproject.toml cannot declare stably: the optional C extensions.

``tracekit.ingest._kineto_scan`` (tracekit/ingest/_kineto_scan.c, plain CPython C API) is the
Kineto parser's native scanner; ``tracekit.ingest._nesting`` (tracekit/ingest/_nesting.c) the
nesting walk every parser runs. ``optional=True``: where they cannot be compiled (no C
compiler, no Python headers) setuptools warns and the install goes on; tracekit then reads
traces the Python way (tracekit/ingest/kineto_native.py, tracekit/ingest/nesting.py).
Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("tracekit.ingest._kineto_scan", ["tracekit/ingest/_kineto_scan.c"], optional=True),
        Extension("tracekit.ingest._nesting", ["tracekit/ingest/_nesting.c"], optional=True),
    ]
)
