"""Finds the CPython interpreters the manifest declares (on PATH or under pyenv), and the one that
judges a wheel in an interpreter of its version (`interpreter_for`)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from packaging.version import Version

from release.errors import GateError


@functools.cache
def version_of(executable: Path) -> str | None:
    """The "X.Y" an interpreter reports by running it (None when it does not run); asked once per
    path and run, as each wheel's interpreter choice and private install ask it again."""
    # pyenv shims exist for every version but fail for ones not selected; run them to be sure.
    try:
        result = subprocess.run(
            [str(executable), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _reports_version(executable: Path, version: str) -> bool:
    return version_of(executable) == version


def no_interpreter(version: str) -> str:
    """The verdict's reason for a wheel no interpreter here can judge."""
    return f"not run: no Python {version} on this runner"


def interpreter_for(serves: Sequence[str], given: Sequence[Path] = ()) -> Path | None:
    """An interpreter of one of the versions `serves` ("3.12", ...): one of `given` (`--python`,
    by the version it reports), else this one, else one found on PATH or under pyenv: the one
    choice of parity, gpu-parity and warm-up. GateError for a given path that does not run (a
    typo must not quietly judge with another interpreter)."""
    for candidate in given:
        version = version_of(candidate)
        if version is None:
            raise GateError(f"--python {candidate}: expected a Python interpreter that runs")
        if version in serves:
            return candidate
    if f"{sys.version_info.major}.{sys.version_info.minor}" in serves:
        return Path(sys.executable)
    for version in serves:
        if found := find_interpreter(version):
            return found
    return None


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
