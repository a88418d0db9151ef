"""Tests against the real, pinned vLLM (nox -s vllm). Skipped where vLLM is not importable.

vLLM imports without a GPU once VLLM_TARGET_DEVICE=cpu is set before its first import. The wheel
under test (ACTIVEKV_TEST_WHEEL, or built by tests/conftest.py's `built_wheel`) is installed into
a private folder that goes first on sys.path (tests/conftest.py's `activekv_site`), so vLLM's
plugin loader finds its entry point.
"""

from __future__ import annotations

import importlib.util
import os

_vllm = importlib.util.find_spec("vllm")
if _vllm is None or _vllm.origin is None:  # absent, or only a namespace package
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
