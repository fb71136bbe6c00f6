"""Parsing a run's files on a Dask cluster (``--executor dask``).

``Client(scheduler)`` (a running cluster; tracekit must be installed on its workers and the
files readable there), or a ``LocalCluster`` when no address is given. Give a cache root on
storage the workers share (a shared path or an fsspec URL): each worker writes the entries
of the files it parses (:func:`~tracekit.ingest.file_task.ingest_one`).
"""

from __future__ import annotations

from typing import Any, Callable

from tracekit.errors import TracekitError
from tracekit.ingest.columns import Parsed
from tracekit.ingest.file_task import IngestTask, WorkerDied, default_jobs, file_size, ingest_one


def _ingest_on_dask(task: IngestTask) -> tuple[str, Parsed | TracekitError]:
    """:func:`ingest_one` for a Dask worker: a user's bad file comes back as a value, not as a
    failed task, which Dask would log with its traceback on the worker's stderr."""
    try:
        return "ok", ingest_one(task)
    except TracekitError as err:
        return "error", err


def run_on_dask(
    tasks: list[IngestTask],
    scheduler: Any,  # an address, a distributed.Client or None
    jobs: int | None,
    on_done: Callable[[IngestTask], None] | None,
    bytes_read: Callable[[int], None] | None,
) -> list[Parsed]:
    """Run ``tasks`` on the cluster at ``scheduler`` (an address or a ``Client``), or on a
    local cluster of ``jobs`` processes (default: one per core, at most one per file); return their results in task order."""
    try:
        from distributed import Client, KilledWorker, LocalCluster, as_completed as dask_completed
    except ImportError:
        raise TracekitError("--executor dask needs Dask: pip install 'tracekit[dask]'") from None
    cluster = None
    if isinstance(scheduler, Client):
        client, own_client = scheduler, False
    else:
        if scheduler:
            try:
                client = Client(scheduler, timeout="30s")  # type: ignore[no-untyped-call]  # distributed leaves it untyped
            except (OSError, TimeoutError) as err:
                raise TracekitError(
                    f"--scheduler {scheduler}: cannot reach a Dask scheduler there ({err}); give "
                    "its address, e.g. tcp://host:8786"
                ) from None
        else:
            import logging
            import warnings

            # Our own private cluster shares this terminal: its logs and notices (its HTTP
            # port moved because another cluster holds 8787) are not the user's business.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cluster = LocalCluster(  # type: ignore[no-untyped-call]  # distributed leaves it untyped
                    n_workers=jobs or default_jobs(len(tasks)),
                    threads_per_worker=1,
                    host="127.0.0.1",
                    dashboard_address=None,
                    silence_logs=logging.CRITICAL,
                )
            client = Client(cluster)  # type: ignore[no-untyped-call]  # distributed leaves it untyped
        own_client = True
    futures = []
    try:
        futures = client.map(_ingest_on_dask, tasks, pure=False)
        index = {future.key: i for i, future in enumerate(futures)}
        results: list[Parsed | None] = [None] * len(tasks)
        for future in dask_completed(futures):  # type: ignore[no-untyped-call]  # distributed leaves it untyped
            i = index[future.key]
            try:
                status, answer = future.result()
            except KilledWorker:
                raise WorkerDied(
                    f"{tasks[i].path}: the Dask workers parsing it died (out of memory?); "
                    "give the workers more memory, or parse locally (--executor local)"
                ) from None
            if status == "error":
                raise answer
            results[i] = answer
            if bytes_read:
                bytes_read(file_size(tasks[i].path))
            if on_done:
                on_done(tasks[i])
        return results  # type: ignore[return-value]
    finally:
        if futures:
            client.cancel([f for f in futures if not f.done()])  # type: ignore[no-untyped-call]  # distributed leaves it untyped
        if own_client:
            client.close()  # type: ignore[no-untyped-call]  # distributed leaves it untyped
        if cluster is not None:
            cluster.close()
