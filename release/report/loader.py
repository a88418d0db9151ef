"""The records under `<out>/`, loaded once for the summary and the report, and resolved once
for a channel (`load_run`): every gate's row, the committed attestations grouped by the wheels
they name, the channel's verdict. Both renderers read that view and load nothing themselves.

A record that is missing is None (that step did not run); one that cannot be read is listed in
``unreadable``, never raised, so the report of a failed run is still written.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from release.report.verdict import STALE, ChannelVerdict, GateRow, channel_verdict
from release.statement import (
    SUFFIX,
    attested_evidence,
    gate_evidence,
    other_wheels,
    read_statement_unverified,
)
from release.util.paths import REPO_ROOT

OTHER_STATEMENT = "another kind of statement: it attests no gate"


@dataclass(frozen=True)
class Committed:
    """A gate attestation committed in a channel's `attestations` folder (a GPU runner's), read
    WITHOUT checking its signature: publishing checks it; the report only shows what it says."""

    path: Path
    evidence: Evidence | None  # None where it cannot be read, or attests no gate
    problem: str = ""  # why `evidence` is None


@dataclass(frozen=True)
class Folder:
    """One `attestations` folder of the manifest's channels, as this checkout holds it."""

    path: Path
    channels: tuple[str, ...]  # the channels that take attestations from it
    attestations: tuple[Committed, ...] = ()
    other_files: int = 0  # files that are not attestations (unsigned records, logs): never taken


@dataclass
class Records:
    build: BuildRecord | None = None
    evidence: dict[str, Evidence] = field(default_factory=dict)
    # As the file holds it: its section reads it as a typed record (report/staging_record.py).
    gpu_staging: dict[str, Any] | None = None
    sign: SignRecord | None = None
    publish: PublishRecord | None = None
    verify: VerifyRecord | None = None
    unreadable: list[str] = field(default_factory=list)  # problems, as lines
    folders: list[Folder] = field(default_factory=list)  # committed attestations, by folder

    def built_digests(self) -> dict[str, str]:
        """Wheel file name to sha256, as the build recorded them."""
        return {w.file: w.sha256 for w in self.build.wheels} if self.build else {}

    def built_sdist(self) -> dict[str, str]:
        """The build's sdist, file name to sha256 (empty where it made none)."""
        sdist = self.build.sdist if self.build else None
        return {sdist.file: sdist.sha256} if sdist else {}


def _optional(out_dir: Path, kind: type[R], unreadable: list[str]) -> R | None:
    try:
        return records.read_optional(out_dir, kind)
    except ReleaseError as error:
        unreadable.append(str(error))
        return None


def _committed(path: Path) -> Committed:
    try:
        statement = read_statement_unverified(path)  # once: its kind, then its evidence
        if statement.gate is None:
            return Committed(path, None, OTHER_STATEMENT)
        return Committed(path, gate_evidence(path, statement))
    except ReleaseError as error:
        return Committed(path, None, str(error))


def attestation_folders(manifest: Manifest, source_dir: Path) -> list[tuple[Path, tuple[str, ...]]]:
    """Each committed `attestations` folder of the manifest's channels (relative to the
    checkout `source_dir`, as publishing resolves them), with the channels that take it."""
    taken: dict[Path, list[str]] = {}
    for name, spec in manifest.release.channels.items():
        for folder in spec.attestations:
            taken.setdefault(source_dir / folder, []).append(name)
    return [(folder, tuple(names)) for folder, names in taken.items()]


def load_folder(path: Path, channels: tuple[str, ...]) -> Folder:
    if not path.is_dir():
        return Folder(path, channels)
    files = sorted(p for p in path.iterdir() if p.is_file())
    attestations = tuple(_committed(p) for p in files if p.name.endswith(SUFFIX))
    return Folder(path, channels, attestations, len(files) - len(attestations))


def load_records(out_dir: Path, folders: Sequence[tuple[Path, tuple[str, ...]]] = ()) -> Records:
    """The records under `out_dir`, and the committed attestations of `folders` (path and the
    channels that take it; `attestation_folders`)."""
    loaded = Records()
    loaded.folders = [load_folder(path, channels) for path, channels in folders]
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


def _verdict(
    evidence: Evidence, built: dict[str, str], sdist: dict[str, str] | None = None
) -> tuple[str, str]:
    other = other_wheels(evidence.artefacts, built) if built else None
    if other is not None:
        return STALE, f"its {evidence.verdict} {other}"
    judged = evidence.judged_sdist
    if judged and sdist and judged != sdist:
        ((name, digest),), ((built_name, built_digest),) = judged.items(), sdist.items()
        return STALE, (f"its {evidence.verdict} judged another sdist: {name} (sha256 "
                       f"{digest[:12]}), not the build's {built_name} "
                       f"({built_digest[:12]})")  # fmt: skip
    return evidence.verdict, evidence.reason


def taken_attestation(records: Records, channel: str, gate: str) -> Committed | None:
    """The committed attestation of `gate` in `channel`'s folders that passed on exactly the
    built wheels: the one publishing would take (once its signature verifies), where this run's
    own evidence did not pass."""
    built = records.built_digests()
    for folder in records.folders:
        for committed in folder.attestations if channel in folder.channels else ():
            evidence = committed.evidence
            if (evidence is not None and built and evidence.gate == gate
                    and _verdict(evidence, built)[0] == "pass"):  # fmt: skip
                return committed
    return None


def gate_rows(manifest: Manifest, channel: str, records: Records) -> list[GateRow]:
    """Every gate of the manifest and every gate with evidence, by name. Evidence that judged
    other wheels than the build recorded is STALE, whatever its verdict said. A required gate
    that did not pass here shows the committed attestation that passed on these wheels, if any
    (a GPU runner's)."""
    required = set(manifest.channel(channel).requires)
    built, sdist = records.built_digests(), records.built_sdist()
    rows = []
    for name in sorted(set(manifest.gates) | set(records.evidence)):
        declared = manifest.gates.get(name)
        recorded = records.evidence.get(name)
        verdict, reason = "not-run", "no evidence in this run"
        if recorded is not None:
            verdict, reason = _verdict(recorded, built, sdist)
        attested = None
        if verdict != "pass" and name in required:
            attested = taken_attestation(records, channel, name)
        if attested is not None and attested.evidence is not None:
            here = f"{verdict}: {reason}" if reason else verdict
            recorded, verdict = attested.evidence, "pass"
            reason = (
                f"attested by the committed {attested.path.name} (this run: {here}); "
                "publishing checks its signature"
            )
        rows.append(
            GateRow(
                name=name,
                runner=declared.runner if declared else "not in the manifest",
                required=name in required,
                verdict=verdict,
                reason=reason,
                evidence=recorded,
                attested_by=attested.path if attested else None,
            )
        )
    return rows


@dataclass(frozen=True)
class AttestationGroup:
    """The committed attestations of one folder that name the same wheels (name and sha256)."""

    artefacts: dict[str, str]
    attestations: tuple[Committed, ...]
    stale: bool | None  # names other wheels than the build's; None where nothing was built

    @property
    def status(self) -> str:
        if self.stale is None:
            return "no build record to compare with"
        return "stale: names other wheels than this build's" if self.stale else "this build's"


def attestation_groups(folder: Folder, built: dict[str, str]) -> list[AttestationGroup]:
    """The readable attestations of `folder`, grouped by the wheels they name: this build's
    first, then the stale groups, newest first."""
    by_wheels: dict[tuple[tuple[str, str], ...], list[Committed]] = {}
    for committed in folder.attestations:
        if committed.evidence is not None:
            key = tuple(sorted(committed.evidence.artefacts.items()))
            by_wheels.setdefault(key, []).append(committed)
    groups = [
        AttestationGroup(dict(key), tuple(found),
                         other_wheels(dict(key), built) is not None if built else None)
        for key, found in by_wheels.items()
    ]  # fmt: skip
    newest = {id(g): max(c.evidence.time for c in g.attestations if c.evidence) for g in groups}
    groups.sort(key=lambda g: newest[id(g)], reverse=True)
    return sorted(groups, key=lambda g: bool(g.stale))


@dataclass(frozen=True)
class FolderView:
    """A committed attestations folder with its attestations grouped by the wheels they name."""

    folder: Folder
    groups: tuple[AttestationGroup, ...]

    @property
    def stale(self) -> int:
        """How many of its attestations name other wheels than the build's."""
        return sum(len(group.attestations) for group in self.groups if group.stale)


@dataclass(frozen=True)
class RunView:
    """One run for one channel, as the summary and the report show it: its records, the build's
    wheels and sdist, every gate's row, the committed attestation folders, the verdict."""

    out_dir: Path
    manifest: Manifest
    channel: str
    source_dir: Path  # the checkout whose committed attestations were read
    records: Records
    built: dict[str, str]  # wheel file name to sha256, as the build recorded them
    sdist: dict[str, str]  # the build's sdist, file name to sha256 (empty where none)
    rows: tuple[GateRow, ...]
    folders: tuple[FolderView, ...]
    verdict: ChannelVerdict

    @property
    def stale(self) -> int:
        """How many committed attestations name other wheels than the build's."""
        return sum(folder.stale for folder in self.folders)


def load_run(
    out_dir: Path, manifest: Manifest, channel: str, source_dir: Path = REPO_ROOT
) -> RunView:
    """The records under `out_dir` and the committed attestations of the checkout `source_dir`,
    loaded and resolved for `channel` once."""
    records = load_records(out_dir, attestation_folders(manifest, source_dir))
    built, sdist = records.built_digests(), records.built_sdist()
    rows = tuple(gate_rows(manifest, channel, records))
    folders = tuple(FolderView(f, tuple(attestation_groups(f, built))) for f in records.folders)
    verdict = channel_verdict(manifest, channel, rows, built, sdist)
    return RunView(out_dir, manifest, channel, source_dir, records, built, sdist, rows, folders,
                   verdict)  # fmt: skip
