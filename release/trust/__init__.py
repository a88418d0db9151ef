"""What makes a release trustworthy to its consumers: signing the provenance (DSSE over in-toto
with SLSA), the index's TUF repository (publisher and consumer side), the index servers
(pypiserver embedded, devpi), publishing without ever replacing a file, and the consumer's
verification.

May import: ``release.util``, ``release.errors``, ``release.manifest``, ``release.records`` and
``release.wheelset``. Never imports build, gates or report.
"""
