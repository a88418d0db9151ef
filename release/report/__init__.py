"""What a release did, for people: the records under ``<out>/`` loaded once, then rendered as the
terminal summary, ``report.md`` and ``report.html``. Reads records; never runs a step.

May import: ``release.util``, ``release.errors``, ``release.manifest``, ``release.evidence``,
``release.records`` and ``release.trust.index`` (the consumer's install line).
"""
