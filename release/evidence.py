"""Evidence records: what each gate judged, its verdict and figures, bound to artefact digests.

Every gate writes one JSON file under `<out>/evidence/`, which the summary and the report read; the
same record, signed by the runner, is its attestation (release/trust/attestation.py), which is
what publishing reads.
"""

from __future__ import annotations

import json
import platform
import socket
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from release.errors import GateError
from release.util.atomic import atomic_write

Verdict = Literal["pass", "fail", "not-run"]
EVIDENCE_SCHEMA = "activekv.evidence/v1"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def runner_identity() -> dict[str, str]:
    """Where a gate ran. GPU gates add the GPU name and the driver."""
    return {
        "kind": "cpu",
        "cpu": _cpu_model(),
        "host": socket.gethostname(),
        "machine": platform.machine(),
        "system": platform.platform(),
        "python": platform.python_version(),
    }


@dataclass(frozen=True)
class Evidence:
    gate: str
    verdict: Verdict
    artefacts: dict[str, str]  # wheel file name -> sha256
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    runner: dict[str, str] = field(default_factory=runner_identity)
    tools: dict[str, str] = field(default_factory=dict)
    time: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    schema: str = EVIDENCE_SCHEMA


def evidence_path(out_dir: Path, gate: str) -> Path:
    return out_dir / "evidence" / f"{gate}.json"


def write_evidence(out_dir: Path, evidence: Evidence) -> Path:
    path = evidence_path(out_dir, evidence.gate)
    atomic_write(path, (json.dumps(asdict(evidence), indent=2, sort_keys=True) + "\n").encode())
    return path


def read_evidence(out_dir: Path, gate: str) -> Evidence | None:
    path = evidence_path(out_dir, gate)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise GateError(f"{path}: expected an evidence record in JSON; {error}") from error
    if not isinstance(data, dict) or data.get("schema") != EVIDENCE_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise GateError(f"{path}: schema: expected {EVIDENCE_SCHEMA!r}; got {got!r}")
    try:
        evidence = Evidence(**data)
    except TypeError as error:
        raise GateError(f"{path}: expected the fields of an evidence record; {error}") from error
    if evidence.gate != gate:
        raise GateError(f"{path}: gate: expected {gate!r}; got {evidence.gate!r}")
    return evidence
