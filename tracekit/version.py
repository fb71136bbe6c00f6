"""tracekit's version (pyproject.toml's), in a module of its own so that every stage, the
parse cache at the bottom among them, can name it without importing the package's top."""

__version__ = "0.1.0"
