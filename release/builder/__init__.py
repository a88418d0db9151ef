"""Making the wheels: the toolchains (hermetic zig + nvcc, or cibuildwheel), the wheel build with
its cache, the ELF checks after linking, the record of wheels built elsewhere, the reproducible
build check and the C++ tests.

May import (the table ``MAY_IMPORT`` in tests/test_architecture.py, which enforces it):
``release.util``, ``release.errors``, ``release.manifest``, ``release.evidence``,
``release.records``, ``release.source_state`` and ``release.wheelset``. Never imports gates, trust
or report.
"""
