"""The GPU runner: whether this machine is one, what its evidence records of it, and the warm-up
gate's figures as the gate and the report print them.

A GPU gate never passes on a machine without a GPU: its evidence says "not run" and why, and a
channel that requires it refuses to publish. May import ``release.errors`` and
``release.evidence`` only: gates, benches and the report all read it.
"""

from __future__ import annotations

import shutil
import subprocess

from release.errors import GateError
from release.evidence import Evidence, runner_identity

NO_GPU_RUNNER = "not run: no GPU runner"
IDENTITY = ("name", "driver_version", "pci.bus_id")


def _query(fields: tuple[str, ...]) -> tuple[list[str] | None, str]:
    """The first GPU's `fields` as nvidia-smi reports them (None without one), and its stderr."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi is not on PATH"
    result = subprocess.run(
        [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
        capture_output=True, text=True,
    )  # fmt: skip
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        return None, result.stderr
    values = [part.strip() for part in lines[0].split(",")]
    return (values if len(values) == len(fields) else None), result.stderr


def detect_gpu() -> str | None:
    """The first GPU's name, or None on a machine without one."""
    values, _ = _query(("name",))
    return values[0] if values else None


def gpu_identity() -> dict[str, str]:
    """Where a GPU gate ran: the runner, its GPU's name, driver and PCI bus id."""
    values, stderr = _query(IDENTITY)
    if values is None:
        raise GateError(f"nvidia-smi --query-gpu: expected the GPU's name; got {stderr!r}")
    name, driver, bus = values
    return {**runner_identity(), "kind": "gpu", "gpu": name, "driver": driver, "pci_bus_id": bus}


def figure_lines(evidence: Evidence) -> list[str]:
    """One line per wheel the warm-up gate judged: its decode step times and allocation counts."""
    return [
        f"{name}: decode step median {figures['decode_step_median_us']} us "
        f"(p99 {figures['decode_step_p99_us']}, back to back "
        f"{figures['decode_step_pipelined_us']}); allocations: warm-up "
        f"{figures['warmup_allocations']}, first second after seal "
        f"{figures['first_second_allocations']}"
        for name, figures in evidence.figures.get("wheels", {}).items()
        if "decode_step_median_us" in figures
    ]
