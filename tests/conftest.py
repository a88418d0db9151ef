"""Helpers shared by the tests that compile small native fixtures."""

from __future__ import annotations

import subprocess
from pathlib import Path

from release.errors import BuildError
from release.toolchain import find_zig


def zig_binary() -> Path | None:
    """The pinned zig, or None where the `build` dependency group is not installed."""
    try:
        return find_zig()
    except BuildError:
        return None


def run_tool(*command: str | Path) -> str:
    """Runs a compiler or binutils command; its stdout, or an assertion naming its stderr."""
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout
