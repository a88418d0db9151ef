"""The gates: each proves one property of the release's wheels and writes evidence bound to
their digests (``<out>/evidence/<gate>.json``).

``contract`` says what a gate declares and returns, ``registry`` lists the gates (one line each)
and runs them; one module per gate (policy, payload, casters, served_path, parity, warmup,
reproducible), with the pieces only a gate uses beside it (citations, trace).

May import: ``release.util``, ``release.errors``, ``release.evidence``, ``release.wheelset``,
``release.manifest`` (gate modules only; ``registry`` and ``contract`` never, because the
manifest checks its gate names against the registry), ``release.build`` (the reproducible gate)
and the constants of ``release.scripts``. Never imports trust or report.
"""
