"""A wheel under test installed into a private folder (`pip install --target`): never into an
environment, never from an index, with no pip configuration of this machine taking part."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import parse_wheel_filename

from release.errors import GateError

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


def install_private(python: Path, wheel: Path, site: Path) -> Path:
    """Installs `wheel` alone with `python` into `site`; GateError with pip's message if not."""
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-compile", "--target", str(site), str(wheel)],
        env=clean_pip_env(), capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise GateError(f"{wheel}: pip install --target {site} failed: {result.stderr.strip()}")
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
