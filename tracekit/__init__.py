"""tracekit: where pipeline-parallel training sits idle, and why."""
__version__ = "0.1.0"


def load(path, **kwargs):
    """Load a run folder (or one trace file) and reconstruct its pipeline.

    Returns a :class:`tracekit.model.Run`. See :func:`tracekit.ingest.load_run`.
    """
    from tracekit.ingest import load_run

    return load_run(path, **kwargs)


def trace_handler(run_dir, schedule=None, *, rank=None):
    """``on_trace_ready`` for ``torch.profiler.profile``: writes each rank's trace, and the
    schedule's facts, into ``run_dir`` as ``tracekit analyze`` reads them.

    See :func:`tracekit.handler.trace_handler`.
    """
    from tracekit.handler import trace_handler as make

    return make(run_dir, schedule, rank=rank)


__all__ = ["__version__", "load", "trace_handler"]
