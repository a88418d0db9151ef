"""Small shared pieces every part of the pipeline may use: atomic writes, digests, console and
progress output, dependency pins, interpreter discovery, private installs, framework wheels, the
checkout's paths.

May import: the standard library, third-party libraries, ``release.errors`` and each other
(tests/test_architecture.py, ``MAY_IMPORT``).
Never imports another subpackage of ``release``.
"""
