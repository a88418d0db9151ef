"""The tools a verdict was reached with, as facts for the reuse store's keys (docs/reuse.md): the
interpreter running the pipeline and every distribution installed beside it, another interpreter
(a wheel's, vLLM's, verify's) asked the same of itself, and the environment variables that change
what a gate or an install does.

Each interpreter is asked once per run and path (a run keys several gates on the same ones).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Variables that change what the pipeline's children find or do: its own settings, Python's,
# the loader's, CUDA's, and PATH (which git, which pythonX.Y).
_ENVIRONMENT_PREFIXES = ("ACTIVEKV_", "PYTHON", "LD_", "CUDA_", "NVIDIA_")
_ENVIRONMENT_NAMES = ("PATH", "SOURCE_DATE_EPOCH")

_PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "print(json.dumps({'version': sys.version, 'executable': sys.executable,\n"
    "  'prefix': sys.prefix, 'distributions': sorted({f\"{d.metadata['Name']}=={d.version}\"\n"
    "  for d in m.distributions() if d.metadata['Name']})}))"
)


def _distributions() -> list[str]:
    found = {f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
             if d.metadata["Name"]}  # fmt: skip
    return sorted(found)


@functools.cache
def running_interpreter() -> dict[str, Any]:
    """This interpreter: its version, executable, prefix and installed distributions."""
    return {"version": sys.version, "executable": sys.executable, "prefix": sys.prefix,
            "distributions": _distributions()}  # fmt: skip


@functools.cache
def interpreter(path: Path) -> dict[str, Any]:
    """What `path` says of itself (as running_interpreter), or why it did not answer."""
    try:
        result = subprocess.run([str(path), "-c", _PROBE], capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"path": str(path), "error": type(error).__name__}
    lines = result.stdout.strip().splitlines()
    try:
        facts = json.loads(lines[-1]) if result.returncode == 0 and lines else None
    except json.JSONDecodeError:
        facts = None
    if not isinstance(facts, dict):
        return {"path": str(path), "error": f"exit {result.returncode}"}
    return {"path": str(path), **facts}


def interpreters(paths: Iterable[Path | None]) -> list[dict[str, Any]]:
    """The facts of each distinct path (None left out), in path order."""
    return [interpreter(path) for path in sorted({p for p in paths if p is not None})]


def environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables that change what a gate or an install does, by name, each value as its
    sha256 (a key is stored: a variable may hold a secret)."""
    return {name: hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()
            for name, value in sorted(environ.items())
            if name.startswith(_ENVIRONMENT_PREFIXES) or name in _ENVIRONMENT_NAMES}  # fmt: skip
