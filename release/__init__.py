"""The ActiveKV release pipeline: build, audit, gate, sign, publish, verify, from the manifest.

Each step is a module of its own and usable alone through ``python -m release <step>``.
"""
