"""GPU runners: detection, and the evidence of GPU gates that could not run here.

A GPU gate never passes on a machine without a GPU: its evidence says "not run" and why, and a
channel that requires it refuses to publish.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from release.digests import sha256_file
from release.evidence import Evidence, write_evidence
from release.manifest import Manifest

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


def record_gpu_gates(manifest: Manifest, wheels: Sequence[Path], out_dir: Path) -> list[Evidence]:
    """Runs every GPU gate of the manifest where a GPU is, else writes "not run" evidence."""
    gpu = detect_gpu()
    artefacts = {wheel.name: sha256_file(wheel) for wheel in wheels}
    records = []
    for name, gate in sorted(manifest.gates.items()):
        if gate.runner != "gpu":
            continue
        if gpu is not None and name == "warmup":
            from release.gpu_gates import run_warmup_gate  # imports this module

            records.append(run_warmup_gate(manifest, wheels, out_dir, artefacts=artefacts, gpu=gpu))
            continue
        reason = NO_GPU_RUNNER if gpu is None else f"not run: no implementation of {name!r} ({gpu})"
        evidence = Evidence(gate=name, verdict="not-run", artefacts=artefacts, reason=reason)
        write_evidence(out_dir, evidence)
        records.append(evidence)
    return records
