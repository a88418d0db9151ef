"""Where the checkout's parts are. The pipeline runs from a checkout and is never installed, so
these are fixed relative to this file."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = REPO_ROOT / "pyproject.toml"
DEFAULT_MANIFEST = REPO_ROOT / "manifests" / "activekv.toml"
# The Python oracle of the engine and the connector: imported by the parity and served-path
# gates from this checkout, never shipped (the payload gate refuses it in a wheel).
REFERENCE_DIR = REPO_ROOT / "reference"
# Programs run in child interpreters (release/scripts/): standard library only.
SCRIPTS_DIR = REPO_ROOT / "release" / "scripts"


def script(name: str) -> Path:
    """The path of one of release/scripts/, e.g. ``script("caster_scan")``."""
    return SCRIPTS_DIR / f"{name}.py"
