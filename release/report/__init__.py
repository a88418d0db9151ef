"""What a release did, for people: the records under ``<out>/`` loaded once, then rendered as the
terminal summary, ``report.md`` and ``report.html``, each led by the channel's verdict on the gates
it requires. Reads records, and the committed gate attestations of the channels' folders; never
runs a step.

May import (the table ``MAY_IMPORT`` in tests/test_architecture.py, which enforces it):
``release.util``, ``release.errors``, ``release.manifest``, ``release.evidence``,
``release.records``, ``release.wheelset`` (the sdist the payload gate's figures name),
``release.statement`` (its unverified readers: publishing verifies), ``release.gpu`` (the warm-up
figure lines) and ``release.trust.index`` (the consumer's install line); third-party:
``markdown_it`` (code spans, as a Markdown viewer finds them), ``rich``, ``matplotlib``.
"""
