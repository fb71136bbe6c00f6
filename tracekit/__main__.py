"""``python -m tracekit``: the ``tracekit`` command, for an environment whose scripts folder
is not on the PATH (a venv not activated, ``pip install --user``)."""

from tracekit.cli import run

if __name__ == "__main__":
    run()
