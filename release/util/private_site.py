"""A wheel under test installed into a private folder (`pip install --target`): never into an
environment, never from an index, with no pip configuration of this machine taking part."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import parse_wheel_filename

from release.errors import GateError
from release.util.interpreters import version_of

# A folder of wheels that `numpy_for` installs from instead of the package index.
WHEELHOUSE_ENV = "ACTIVEKV_WHEELHOUSE"

# Variables that would let something other than the index, or other than the venv, answer.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "VIRTUAL_ENV")


def clean_pip_env() -> dict[str, str]:
    """The environment for pip: no ``PIP_*`` variable inherited, no pip configuration file."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in _DROPPED_ENV
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PIP_NO_CACHE_DIR"] = "1"  # a cached answer is not what the index serves now
    return env


def _pip_target(python: Path, site: Path, *requirements: str, index: bool = False) -> None:
    """`pip install --target site` for the interpreter `python`, run by this interpreter's pip
    (an interpreter carried to a runner may have none): pip takes only what `python`'s version
    can import (`--python-version`, binary wheels only)."""
    version = version_of(python)
    if version is None:
        raise GateError(f"{python}: expected a Python interpreter that runs")
    sources = ["--no-index"]
    if index and (wheelhouse := os.environ.get(WHEELHOUSE_ENV)):
        sources = ["--no-index", "--find-links", wheelhouse]
    elif index:
        sources = []  # the package index pip is configured for (never this machine's config)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--only-binary=:all:", "--implementation", "cp", "--python-version", version,
         *sources, "--target", str(site), *requirements],
        env=clean_pip_env(), capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        wanted = " ".join(requirements)
        raise GateError(f"pip install --target {site} {wanted} for Python {version} failed: "
                        f"{result.stderr.strip()}")  # fmt: skip


def install_private(python: Path, wheel: Path, site: Path) -> Path:
    """Installs `wheel` alone into `site`, for the interpreter `python`; GateError with pip's
    message if it cannot (a wheel of another Python version, say)."""
    _pip_target(python, site, str(wheel))
    return site


def numpy_for(python: Path, cache_dir: Path, version: str) -> Path | None:
    """A folder to put on `python`'s path so that it imports numpy `version`: None when it
    imports numpy already; else a cached private site, installed from $ACTIVEKV_WHEELHOUSE (a
    folder of wheels, for a runner without network) or from the package index."""
    probe = subprocess.run([str(python), "-c", "import numpy"], capture_output=True)
    if probe.returncode == 0:
        return None
    site = cache_dir / "numpy" / f"{version_of(python)}-{version}"
    if not (site / "numpy").is_dir():
        partial = site.with_name(site.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _pip_target(python, partial, f"numpy=={version}", index=True)
        partial.replace(site)
    return site


def wheel_for_tags(wheels: Sequence[Path], tags: Sequence[str]) -> Path | None:
    """The wheel an interpreter with these tags (most preferred first) installs, or None."""
    ranked = [
        (min(tags.index(str(t)) for t in parse_wheel_filename(w.name)[3] if str(t) in tags), w)
        for w in wheels
        if any(str(t) in tags for t in parse_wheel_filename(w.name)[3])
    ]
    return min(ranked)[1] if ranked else None


def wheel_for_this_interpreter(wheels: Sequence[Path]) -> Path:
    """The built wheel that installs on the interpreter running the gate."""
    from packaging.tags import sys_tags

    chosen = wheel_for_tags(wheels, [str(tag) for tag in sys_tags()])
    if chosen is None:
        raise GateError(
            f"no built wheel installs on Python {sys.version.split()[0]}: "
            f"{[w.name for w in wheels]}"
        )
    return chosen
