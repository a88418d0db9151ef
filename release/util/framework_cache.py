"""Pinned wheels (the frameworks that shims cite, and the build requirements whose digests the
provenance records), fetched once with ``pip download --no-deps``.

Wheels are kept in ``<cache>/frameworks/`` and found again by name and version, so the payload
gate downloads a framework (vLLM's wheel is ~340 MB) once per cache, not once per run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from release.errors import GateError


def cached_wheel(directory: Path, name: str, version: str) -> Path | None:
    """The wheel of ``name==version`` already in ``directory``, if any."""
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("*.whl")):
        try:
            found, found_version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if found == canonicalize_name(name) and found_version == Version(version):
            return path
    return None


def framework_wheel(
    name: str, version: str, cache_dir: Path, *, pip_args: Sequence[str] = ()
) -> Path:
    """The wheel of ``name==version``: from the cache, else downloaded into it (``pip_args`` are
    added to ``pip download``, e.g. ``--no-index --find-links DIR``)."""
    directory = cache_dir / "frameworks"
    if found := cached_wheel(directory, name, version):
        return found
    directory.mkdir(parents=True, exist_ok=True)
    # Downloaded into a temporary folder and moved in whole: a failed download leaves nothing.
    with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as scratch:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "--dest", scratch, f"{name}=={version}",
            *pip_args,
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            tail = " ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
            raise GateError(
                f"{name}=={version}: expected `pip download --no-deps` to fetch its wheel; pip "
                f"exited {result.returncode}: {tail}"
            )
        downloaded = cached_wheel(Path(scratch), name, version)
        if downloaded is None:
            raise GateError(f"{name}=={version}: pip download produced no wheel of it")
        target = directory / downloaded.name
        os.replace(downloaded, target)
    return target
