"""Benchmarks that print ratios against a baseline measured in the same run: the engine's
host-side bookkeeping against the Python reference, the CUDA route's staging against the
bus baselines on a GPU runner, and warm releases against a cold one (``warm_runs``, which runs
``python -m release run`` as a command). Never judges a release.

May import (the table ``MAY_IMPORT`` in tests/test_architecture.py, which enforces it):
``release.util``, ``release.errors``, ``release.manifest``, ``release.records``,
``release.wheelset``, ``release.builder`` (the C++ toolchain), ``release.gpu`` and
``release.scripts`` (the parity replay's implementations, run here in-process).
"""
