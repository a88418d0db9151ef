"""Whether this machine is a GPU runner.

A GPU gate never passes on a machine without a GPU: its evidence says "not run" and why, and a
channel that requires it refuses to publish.
"""

from __future__ import annotations

import shutil
import subprocess

NO_GPU_RUNNER = "not run: no GPU runner"


def detect_gpu() -> str | None:
    """The first GPU's name as nvidia-smi reports it, or None on a machine without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    result = subprocess.run(
        [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
    )
    names = result.stdout.strip().splitlines()
    return names[0].strip() if result.returncode == 0 and names else None
