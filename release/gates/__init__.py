"""The gates: each proves one property of the release's wheels and writes evidence bound to
their digests (``<out>/evidence/<gate>.json``).

``contract`` says what a gate declares and returns, ``registry`` loads the gates of
``release.catalogue`` (one line each) and runs them; one module per gate (policy, payload, casters,
served_path, parity, warmup, reproducible), with the pieces only a gate uses beside it (citations,
trace).

May import (the table ``MAY_IMPORT`` in tests/test_architecture.py, which enforces it):
``release.util``, ``release.errors``, ``release.manifest``, ``release.catalogue``,
``release.records``, ``release.evidence``, ``release.wheelset``, ``release.gpu``,
``release.builder`` (the reproducible gate) and the constants of ``release.scripts`` (its functions
run in child interpreters). Never imports trust or report.
"""
