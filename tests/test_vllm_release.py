"""Which vLLM releases the connector serves (bindings/vllm_release.h): the built module's rule,
read as PEP 440 reads the manifest's `supports`, for every kind of version string vLLM can report.

No vLLM here: the rule is a function of the version string. tests/with_vllm/ checks the refusal
itself inside vLLM's plugin loader.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from release.manifest import load_manifest

REPO = Path(__file__).resolve().parents[1]
(SHIM,) = load_manifest(REPO / "manifests" / "activekv.toml").payload.shims

VERSIONS = [
    # supported: each pinned release, its patch releases, post, dev and local builds in between
    "0.32.0", "0.32", "0.32.1", "0.32.0.post1", "0.32.0.post1.dev1", "0.32.1rc1",
    "0.32.1.dev3+g1a2b3c", "0.33.0", "0.33.0+cpu", "0.33.7", "0.33.99.post2", "0.33.0rc1",
    "v0.33.0", "0.33.0-1",
    # refused: older, newer, pre-releases of the lower bound, any release of 0.34, other series
    "0.31.0", "0.31.99", "0.32.0rc1", "0.32.0.dev0", "0.32.0a1", "0.34.0", "0.34.0rc1",
    "0.34.0.dev0", "0.34", "1.0.0", "0.4.0", "0.320.0", "0", "",
    # not versions at all
    "garbage", "0.33.0 ", "0.33.x", "latest",
]  # fmt: skip


@pytest.fixture(scope="module")
def vllm_module(engine_site: Path) -> object:
    if str(engine_site) not in sys.path:
        sys.path.insert(0, str(engine_site))
    from activekv import _vllm

    return _vllm


def pep440_says(version: str) -> bool:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    return SpecifierSet(SHIM.supports).contains(parsed, prereleases=True)


def test_the_module_declares_the_manifests_range(vllm_module: object) -> None:
    assert vllm_module.SUPPORTED_VLLM == SHIM.supports == ">=0.32,<0.34"  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rule_is_pep440s_reading_of_the_range(vllm_module: object, version: str) -> None:
    supported = vllm_module.vllm_version_supported(version)  # type: ignore[attr-defined]
    assert supported == pep440_says(version), version


def test_every_pinned_release_is_served(vllm_module: object) -> None:
    for pin in SHIM.versions:
        assert vllm_module.vllm_version_supported(pin.version)  # type: ignore[attr-defined]
