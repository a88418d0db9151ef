"""Finds the CPython interpreters the manifest declares, on PATH or under pyenv."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from packaging.version import Version


def _reports_version(executable: Path, version: str) -> bool:
    # pyenv shims exist for every version but fail for ones not selected; run them to be sure.
    try:
        result = subprocess.run(
            [str(executable), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and result.stdout.strip() == version


def _pyenv_candidates(version: str) -> list[Path]:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if not root.is_dir():
        return []
    installs = [
        path
        for path in root.glob(f"{version}.*")
        if path.name[len(version) + 1 :].isdigit()  # plain CPython builds, not 3.12.1t etc.
    ]
    installs.sort(key=lambda path: Version(path.name), reverse=True)
    return [path / "bin" / f"python{version}" for path in installs]


def find_interpreter(version: str) -> Path | None:
    """A working `pythonX.Y` for `version` ("3.12"), preferring real pyenv installs over shims."""
    candidates = _pyenv_candidates(version)
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and _reports_version(candidate, version):
            return candidate
    return None
