"""Where the checkout's parts are. The pipeline runs from a checkout and is never installed, so
these are fixed relative to this file."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = REPO_ROOT / "pyproject.toml"
# The licence files the wheel takes: pyproject's [project] license-files (PEP 639;
# tests/test_build_cache_key.py keeps them equal), as git pathspecs and Path.glob patterns.
LICENSE_FILES = ("LICENSE", "NOTICE", "LICENSES/*.txt")
# What decides a wheel's bytes, besides the toolchain, the interpreter and the build environment
# (release/builder/wheels.py).
SOURCE_ROOTS = (
    "CMakeLists.txt",
    "pyproject.toml",
    "DESCRIPTION.md",  # the long description (pyproject readme)
    "engine",
    "bindings",
    "shims",
    "cmake",
    *LICENSE_FILES,
)
DEFAULT_MANIFEST = REPO_ROOT / "manifests" / "activekv.toml"
# The Python oracle of the engine and the connector: imported by the parity and served-path
# gates from this checkout, never shipped (the payload gate refuses it in a wheel).
REFERENCE_DIR = REPO_ROOT / "reference"
# Programs run in child interpreters (release/scripts/): standard library only.
SCRIPTS_DIR = REPO_ROOT / "release" / "scripts"


def script(name: str) -> Path:
    """The path of one of release/scripts/, e.g. ``script("caster_scan")``."""
    return SCRIPTS_DIR / f"{name}.py"
