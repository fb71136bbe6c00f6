"""tracekit: where pipeline-parallel training sits idle, and why."""
from tracekit.version import __version__


def load(path, **kwargs):
    """Load a run folder (or one trace file) and reconstruct its pipeline.

    Returns a :class:`tracekit.model.Run`. See :func:`tracekit.ingest.load_run`.
    """
    from tracekit.ingest import load_run

    return load_run(path, **kwargs)


__all__ = ["__version__", "load"]
