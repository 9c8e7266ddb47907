"""Instances by the paper's protocol, the paper's experiments, adaptation traces and benchmarks: everything that
measures the solvers rather than running a cluster.

The long runs (:func:`vcsched.experiments.bench.run_bench`,
:func:`vcsched.experiments.paper.run_items`,
:func:`vcsched.experiments.adaptation.run_traces`) print nothing: they report
how far they got through an :data:`OnProgress` callback, always called in the
caller's process (also when the work runs in worker processes), first with
``done = 0`` and last with ``done = total``.
"""

from collections.abc import Callable

#: ``on_progress(done, total, description)``: ``done`` of ``total`` units of work are finished; ``description``
#: names the work (or the piece of it that starts now).
OnProgress = Callable[[int, int, str], None]
