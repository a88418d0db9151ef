"""`python -m release record-build`: `<out>/build.json` for wheels built elsewhere.

In CI the wheels are built by cibuildwheel in a matrix and handed to the release job as files;
signing needs the record `python -m release build` would have written: each wheel, the Python
versions it serves, its size and sha256, SOURCE_DATE_EPOCH and the toolchain. This step writes
it from the wheels themselves, refusing a wheel for a Python version the manifest does not declare.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from release.build import source_date_epoch, version_tuple
from release.digests import sha256_file
from release.errors import BuildError
from release.manifest import Manifest
from release.pins import pinned_version


def served_versions(manifest: Manifest, wheel: Path) -> tuple[str, tuple[str, ...]]:
    """(the version a wheel was built for, the declared versions it installs on)."""
    declared = manifest.build.python
    tags = parse_wheel_filename(wheel.name)[3]
    built_for = {f"{tag.interpreter[2]}.{tag.interpreter[3:]}" for tag in tags}
    stable_abi = any(tag.abi == "abi3" for tag in tags)
    if len(built_for) != 1 or not built_for <= set(declared):
        raise BuildError(
            f"{wheel.name}: expected a wheel for one of build.python {list(declared)} of "
            f"{manifest.path}; its tags name {sorted(built_for)}"
        )
    (version,) = built_for
    if not stable_abi:
        return version, (version,)
    return version, tuple(v for v in declared if version_tuple(v) >= version_tuple(version))


def record_build(manifest: Manifest, source_dir: Path, wheels: Sequence[Path]) -> dict[str, Any]:
    now = datetime.now(timezone.utc).isoformat()
    cibuildwheel = pinned_version("build", "cibuildwheel") or "unknown"
    entries = []
    for wheel in wheels:
        python, serves = served_versions(manifest, wheel)
        entries.append({
            "file": wheel.name, "python": python, "serves": list(serves), "seconds": 0.0,
            "cached": False, "size": wheel.stat().st_size, "sha256": sha256_file(wheel),
        })  # fmt: skip
    return {
        "started": now,
        "finished": now,
        "source_date_epoch": source_date_epoch(source_dir),
        "toolchain": {"kind": "cibuildwheel", "cibuildwheel": cibuildwheel},
        "wheels": entries,
        "skipped": [],
    }
