"""Benchmarks that print ratios against a baseline measured in the same run: the engine's
host-side bookkeeping against the Python reference, and the CUDA route's staging against the
bus baselines on a GPU runner. Never judges a release.

May import: ``release.util``, ``release.errors``, ``release.manifest``, ``release.records``,
``release.build`` (the C++ toolchain) and ``release.gates`` (the wheel install and the trace).
"""
