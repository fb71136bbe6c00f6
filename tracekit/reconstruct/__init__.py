"""Reconstruct: turn per-rank events into a pipeline timeline (steps, actions, messages,
schedule). The whole run's reconstruction is :func:`tracekit.reconstruct.whole_run.reconstruct`
(on the client, with pandas); :mod:`.per_rank` is what parser workers run on one rank's columns
(numpy only): this package imports nothing, so a worker loads only what it uses."""
