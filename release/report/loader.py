"""The records under `<out>/`, loaded once for the summary and the report.

A record that is missing is None (that step did not run); one that cannot be read is listed in
``unreadable``, never raised, so the report of a failed run is still written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release import records
from release.errors import ReleaseError
from release.evidence import Evidence, read_evidence
from release.manifest import Manifest
from release.records import (
    GPU_STAGING_RECORD,
    BuildRecord,
    PublishRecord,
    R,
    SignRecord,
    VerifyRecord,
)
from release.trust.attestation import attested_evidence, other_wheels


@dataclass
class Records:
    build: BuildRecord | None = None
    evidence: dict[str, Evidence] = field(default_factory=dict)
    gpu_staging: dict[str, Any] | None = None
    sign: SignRecord | None = None
    publish: PublishRecord | None = None
    verify: VerifyRecord | None = None
    unreadable: list[str] = field(default_factory=list)  # problems, as lines

    def built_digests(self) -> dict[str, str]:
        """Wheel file name to sha256, as the build recorded them."""
        return {w.file: w.sha256 for w in self.build.wheels} if self.build else {}


def _optional(out_dir: Path, kind: type[R], unreadable: list[str]) -> R | None:
    try:
        return records.read_optional(out_dir, kind)
    except ReleaseError as error:
        unreadable.append(str(error))
        return None


def load_records(out_dir: Path) -> Records:
    loaded = Records()
    problems = loaded.unreadable
    loaded.build = _optional(out_dir, BuildRecord, problems)
    loaded.sign = _optional(out_dir, SignRecord, problems)
    loaded.publish = _optional(out_dir, PublishRecord, problems)
    loaded.verify = _optional(out_dir, VerifyRecord, problems)
    try:
        loaded.gpu_staging = records.read_measurement(out_dir, GPU_STAGING_RECORD)
    except ReleaseError as error:
        problems.append(str(error))
    for path in sorted((out_dir / "evidence").glob("*.json")):
        if path.name.endswith(".intoto.json"):  # the signed copy: publishing's, not the report's
            continue
        try:
            evidence = read_evidence(out_dir, path.stem)
        except ReleaseError as error:
            problems.append(str(error))
            continue
        if evidence is not None:
            loaded.evidence[evidence.gate] = evidence
    # What the signed provenance rests on is what the release's gates said (a GPU gate's
    # attestation made on a runner, where this run's own record says "not run").
    for gate, path in (loaded.sign.attestations if loaded.sign else {}).items():
        try:
            loaded.evidence[gate] = attested_evidence(Path(path))
        except ReleaseError as error:
            problems.append(str(error))
    return loaded


def recorded_channel(out_dir: Path, manifest: Manifest) -> str:
    """The channel the records of `out_dir` were made for, else the manifest's default."""
    for kind in (PublishRecord, SignRecord):
        try:
            found = records.read_optional(out_dir, kind)
        except ReleaseError:
            continue
        if found is not None and found.channel in manifest.release.channels:
            return found.channel
    return manifest.release.default_channel


@dataclass(frozen=True)
class GateRow:
    """One gate as the summary and the report show it: declared, recorded, or both."""

    name: str
    runner: str  # the manifest's runner, or "not in the manifest"
    required: bool  # by the channel
    verdict: str  # the evidence's, or "not-run"
    reason: str  # the evidence's, or why there is none
    evidence: Evidence | None


# A verdict on other wheels than the build's: shown with its reason, never as this run's verdict.
STALE = "other-wheels"


def gate_rows(manifest: Manifest, channel: str, records: Records) -> list[GateRow]:
    """Every gate of the manifest and every gate with evidence, by name. Evidence that judged
    other wheels than the build recorded is STALE, whatever its verdict said."""
    required = set(manifest.channel(channel).requires)
    built = records.built_digests()
    rows = []
    for name in sorted(set(manifest.gates) | set(records.evidence)):
        declared = manifest.gates.get(name)
        recorded = records.evidence.get(name)
        verdict, reason = "not-run", "no evidence in this run"
        if recorded is not None:
            verdict, reason = recorded.verdict, recorded.reason
            other = other_wheels(recorded.artefacts, built) if built else None
            if other is not None:
                verdict, reason = STALE, f"its {recorded.verdict} {other}"
        rows.append(
            GateRow(
                name=name,
                runner=declared.runner if declared else "not in the manifest",
                required=name in required,
                verdict=verdict,
                reason=reason,
                evidence=recorded,
            )
        )
    return rows
