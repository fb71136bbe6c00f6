"""The one thing pyproject.toml cannot declare stably: the optional C extension.

``tracekit.ingest._kineto_scan`` (tracekit/ingest/_kineto_scan.c, plain CPython C API) is the
Kineto parser's native scanner. ``optional=True``: where it cannot be compiled (no C compiler,
no Python headers) setuptools warns and the install goes on; tracekit then reads traces the
Python way (tracekit/ingest/kineto_native.py). Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tracekit.ingest._kineto_scan", ["tracekit/ingest/_kineto_scan.c"], optional=True)])
