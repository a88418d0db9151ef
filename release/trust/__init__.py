"""What makes a release trustworthy to its consumers: signing the provenance (DSSE over in-toto
with SLSA), the index's TUF repository (publisher and consumer side), the index servers
(pypiserver embedded; a remote devpi, pypiserver or other index), publishing without ever
replacing a file, and the consumer's verification; and ``steps``, the command line's sign,
publish, verify and serve steps.

May import: ``release.util``, ``release.errors``, ``release.manifest``, ``release.records``,
``release.wheelset``, ``release.source_state``, and for ``steps`` ``release.context`` and
``release.evidence``. Never imports build, gates or report.
"""
