"""A command run with its output appended to a log: the build, the sdist and a rebuild read only
the log's tail when it fails."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from release.errors import BuildError


def run_logged(
    command: list[str], env: Mapping[str, str], log: Path, what: str, cwd: Path | None = None
) -> None:
    """Runs `command` with its output appended to `log`; BuildError with the log's tail if it
    fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as stream:
        stream.write(f"$ {' '.join(command)}\n")
        stream.flush()
        result = subprocess.run(command, env=env, cwd=cwd, stdout=stream, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise BuildError(f"{what} failed (exit {result.returncode}); log: {log}\n{tail}")
