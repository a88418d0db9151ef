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

from pydantic import BaseModel, ConfigDict, ValidationError

from release.errors import GateError
from release.records import Sha256
from release.util.atomic import atomic_write
from release.util.jsonfile import JsonFileError, read_json

Verdict = Literal["pass", "fail", "not-run"]
EVIDENCE_SCHEMA = "activekv.evidence/v1"
# The key of the payload gate's figures that names the sdist it judged: {"file", "sha256", …}.
SDIST_FIGURE = "sdist"


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

    @property
    def judged_sdist(self) -> dict[str, str]:
        """The sdist its figures say it judged (file name to sha256; empty when none)."""
        found = self.figures.get(SDIST_FIGURE)
        if not isinstance(found, dict):
            return {}
        name, digest = found.get("file"), found.get("sha256")
        return {name: digest} if isinstance(name, str) and isinstance(digest, str) else {}

    schema: str = EVIDENCE_SCHEMA


class _Fields(BaseModel):
    """Every field of a record as read back: all present (the reader's machine and clock must
    never stand in for the gate's), each of its type, nothing else."""

    model_config = ConfigDict(extra="forbid", strict=True)
    gate: str
    verdict: Verdict
    artefacts: dict[str, Sha256]
    figures: dict[str, Any]
    reason: str
    runner: dict[str, str]
    tools: dict[str, str]
    time: str


def evidence_from_fields(fields: object) -> Evidence:
    """An Evidence from its fields as read (schema left out); ValueError saying the first key
    that is missing or not of its type, as `<key>: expected …; got …`."""
    try:
        checked = _Fields.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "<top level>"
        got = json.dumps(first.get("input"), default=str)[:80]
        raise ValueError(f"{key}: expected {first['msg'].lower()}; got {got}") from None
    return Evidence(**checked.model_dump())


def evidence_path(out_dir: Path, gate: str) -> Path:
    return out_dir / "evidence" / f"{gate}.json"


def write_evidence(out_dir: Path, evidence: Evidence) -> Path:
    path = evidence_path(out_dir, evidence.gate)
    try:
        text = json.dumps(asdict(evidence), indent=2, sort_keys=True, allow_nan=False)
    except ValueError as error:  # NaN or infinity among the figures: not JSON, never readable
        raise GateError(f"{path}: figures: expected finite numbers; {error}") from None
    atomic_write(path, (text + "\n").encode())
    return path


def read_evidence(out_dir: Path, gate: str) -> Evidence | None:
    path = evidence_path(out_dir, gate)
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except JsonFileError as error:
        raise GateError(f"{path}: evidence record: {error}") from None
    if not isinstance(data, dict) or data.get("schema") != EVIDENCE_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise GateError(f"{path}: schema: expected {EVIDENCE_SCHEMA!r}; got {got!r}")
    try:
        evidence = evidence_from_fields({k: v for k, v in data.items() if k != "schema"})
    except ValueError as error:
        raise GateError(f"{path}: {error}") from None
    if evidence.gate != gate:
        raise GateError(f"{path}: gate: expected {gate!r}; got {evidence.gate!r}")
    return evidence
