"""Tests against the real, pinned vLLM (nox -s vllm). Skipped where vLLM is not importable.

vLLM imports without a GPU once VLLM_TARGET_DEVICE=cpu is set before its first import. The wheel
under test (ACTIVEKV_TEST_WHEEL, or built by tests/conftest.py's `built_wheel`) is installed into
a private folder that goes first on sys.path, so vLLM's plugin loader finds its entry point.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_vllm = importlib.util.find_spec("vllm")
if _vllm is None or _vllm.origin is None:  # absent, or only a namespace package
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture(scope="session")
def activekv_site(engine_site: Path) -> Path:
    """The wheel under test, importable (and its entry points visible) in this process."""
    if str(engine_site) not in sys.path:
        sys.path.insert(0, str(engine_site))
    return engine_site
