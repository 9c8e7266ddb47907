"""Instances by the paper's protocol, the paper's experiments, adaptation traces and benchmarks: everything that
measures the solvers rather than running a cluster."""
