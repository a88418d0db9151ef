"""`--toolchain cibuildwheel`: the standard tool, for CI systems that have manylinux containers.

cibuildwheel reads `[tool.cibuildwheel]` of pyproject.toml (kept equal to the manifest by
tests/test_cibuildwheel_config.py). Its Linux builds run inside manylinux containers, so a
container engine must answer; where none does, the build stops and says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from release.errors import BuildError

_ENGINES = ("docker", "podman")


def container_engine() -> str:
    """The first container engine whose daemon answers; BuildError says why none does."""
    reasons: list[str] = []
    for engine in _ENGINES:
        if shutil.which(engine) is None:
            reasons.append(f"{engine}: not installed")
            continue
        try:
            result = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            reasons.append(f"{engine} info: no answer in 30 s")
            continue
        if result.returncode == 0:
            return engine
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        reasons.append(f"{engine} info: {last}")
    raise BuildError(
        "--toolchain cibuildwheel: cibuildwheel builds Linux wheels inside manylinux containers, "
        f"and no container engine answers here ({'; '.join(reasons)}); use --toolchain hermetic"
    )


def selectors(pythons: Sequence[str]) -> str:
    """CIBW_BUILD for the planned wheels (the abi3 tag comes from pyproject's wheel.py-api)."""
    return " ".join(f"cp{p.replace('.', '')}-manylinux_x86_64" for p in pythons)


def run_cibuildwheel(source_dir: Path, output_dir: Path, build: str, env: dict[str, str]) -> None:
    engine = container_engine()
    command = [sys.executable, "-m", "cibuildwheel", "--platform", "linux",
               "--output-dir", str(output_dir), str(source_dir)]  # fmt: skip
    run_env = {**os.environ, **env, "CIBW_BUILD": build, "CIBW_CONTAINER_ENGINE": engine}
    if subprocess.run(command, env=run_env).returncode != 0:
        raise BuildError("cibuildwheel failed; see its output above")
