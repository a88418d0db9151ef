"""What makes a release trustworthy to its consumers: signing the provenance (DSSE over in-toto
with SLSA), the index's TUF repository (publisher and consumer side), the index servers
(pypiserver embedded; a remote devpi, pypiserver or other index), publishing without ever
replacing a file, and the consumer's verification; and the command line's steps: ``steps``
(sign, publish, verify and serve) and ``consumer_steps`` (``verify --index`` and ``rebuild``).

May import (the table ``MAY_IMPORT`` in tests/test_architecture.py, which enforces it):
``release.util``, ``release.errors``, ``release.manifest``, ``release.catalogue`` (a gate's
runner), ``release.records``, ``release.evidence`` (what an attestation signs),
``release.statement``, ``release.source_state``, ``release.wheelset``, and for the two step
modules alone ``release.context``. Never imports builder, gates or report.
"""
