"""Publish step: upload wheels, and the sdist built beside them, to a package index with twine,
never replacing a published file, and store the signed statement (DSSE envelope) of the version
next to the index.

Rules:
* One publish is one project version, known by its public version as pip compares versions:
  ``0.1`` and ``0.1.0`` are one version (their statements and index files are one release's),
  and a local version label (``0.1.0+hotfix``, which pip takes for ``==0.1.0``) is refused.
* Each wheel, the sdist, the statement and each attestation is copied into a private folder
  first; what is hashed, checked and uploaded or stored is that copy, so a file changed after the
  check is not what reaches the index.
* The sdist is of the wheels' project and version (PEP 625 file name), or the publish is refused.
* The statement must name exactly the files given (wheels and sdist: names and digests), and
  exactly the attestations given.
* A file the index already has with different bytes refuses the whole publish, and so does a
  file of the same version the publish does not give; nothing is uploaded.
* A file the index already has with identical bytes is not uploaded again.
* The first publish of a version stores its statement before its first upload: that statement
  fixes the version's files (names and digests). It is never overwritten, and a publish that gives
  another set of files is refused before anything is uploaded.
* The attestations the statement names are stored before it, and kept only when they are what
  the statement that is kept names: one left by a publish killed before it stored its statement
  (no stored statement names it) is replaced, and nothing a stored statement names is replaced.
* The index stores an upload whole or not at all (release/scripts/index_server.py); a refused
  upload names what the index answered (release/trust/twine_upload.py).
* After uploading, the index's listing must show every file with its local digest.
* Then the TUF repository (when given) names every file and the statement as targets; its
  timestamp is the commit point, so a publish killed between two uploads, or before that, is
  completed by running it again (the files already there are skipped as identical).
* Every key the TUF commit signs with is loaded before the first upload (TufRepository.check).
* Its message says what this run changed: the files it uploaded (or that all were there), the
  statement it stored, the TUF commit it made or completed; a failure after the first upload
  says what had been uploaded and stored, and that running the same publish again completes it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from packaging.utils import InvalidSdistFilename, parse_sdist_filename

from release.errors import PublishError, ReleaseError
from release.manifest import NetworkLimits
from release.statement import SignedStatement
from release.trust import twine_upload
from release.trust.index import list_project_files
from release.trust.release_version import (
    attestation_target,
    normalize_project,
    of_version,
    project_and_version,
    statement_target,
    version_key,
)
from release.trust.statement_store import PrivateCopies, plan_storage, store_intent
from release.trust.tuf_metadata import TufRepository, TufUpdate
from release.util.pauses import pause_for_tests
from release.util.progress import tracked

UPLOADED = "uploaded"
ALREADY_PRESENT = "already present, identical"

# Tests only: seconds to sleep after each upload, so that a test can kill a publish between two.
PAUSE_ENV = "ACTIVEKV_TEST_PAUSE_AFTER_UPLOAD_S"


class IndexTarget(Protocol):
    """Where to publish: an :class:`release.trust.index.EmbeddedIndex`, a
    :class:`release.trust.remote_index.RemoteIndex`, or any index with these."""

    @property
    def url(self) -> str: ...

    @property
    def simple_url(self) -> str: ...

    @property
    def username(self) -> str: ...

    @property
    def password(self) -> str: ...

    def overwrite_note(self) -> str | None:
        """Said when a file of a published name is refused, if the server itself would have
        replaced it (None: it would not, or does not say)."""
        ...


@dataclass(frozen=True)
class PublishedFile:
    filename: str
    sha256: str
    outcome: str  # UPLOADED or ALREADY_PRESENT


@dataclass(frozen=True)
class PublishReport:
    project: str
    version: str
    files: tuple[PublishedFile, ...]
    envelope_path: Path
    envelope_stored: bool  # False: an earlier envelope of this version was kept
    message: str
    tuf: TufUpdate | None = None

    @property
    def uploaded(self) -> tuple[str, ...]:
        return tuple(f.filename for f in self.files if f.outcome == UPLOADED)

    @property
    def already_present(self) -> tuple[str, ...]:
        return tuple(f.filename for f in self.files if f.outcome == ALREADY_PRESENT)


def publish(
    wheels: Sequence[Path],
    index: IndexTarget,
    *,
    envelope: Path,
    metadata_dir: Path,
    tuf: TufRepository | None = None,
    digests: Mapping[str, str] | None = None,
    attachments: Mapping[str, Path] | None = None,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008 (frozen: the manifest's defaults)
    sdist: Path | None = None,
    signed: SignedStatement | None = None,
) -> PublishReport:
    """Upload the ``wheels`` and the ``sdist`` not yet on ``index``, store ``envelope`` for their
    version and make all of them TUF targets of ``tuf``. ``digests`` are the files' sha256 as
    the caller hashed them (the bytes its gates judged): the copies published must still have
    them. ``attachments`` (name -> file: the gate attestations the statement names) are stored
    beside the statement, as targets too. ``limits`` bound every read from the index
    (``[publish.limits]``). ``signed``: ``envelope`` as the caller read and verified it, taken
    for the private copy when the copy's bytes are those very bytes (else the copy is read)."""
    project, version = project_and_version(wheels)
    files = list(wheels)
    if sdist is not None:
        _check_sdist_name(sdist, project, version)
        files.append(sdist)
    with tempfile.TemporaryDirectory(prefix="activekv-publish-") as private:
        copies = PrivateCopies.make(Path(private), files, envelope, attachments or {},
                                    version=version, hashed=digests, signed=signed)  # fmt: skip
        return _publish_copies(copies, index, project, version, metadata_dir, tuf, limits)


def _check_sdist_name(sdist: Path, project: str, version: str) -> None:
    """PublishError unless ``sdist`` is a PEP 625 sdist of ``project`` ``version`` (the wheels')."""
    try:
        name, found = parse_sdist_filename(sdist.name)
    except InvalidSdistFilename as error:
        raise PublishError(f"sdist {sdist}: expected <name>-<version>.tar.gz (PEP 625); "
                           f"{error}. Nothing was uploaded") from None  # fmt: skip
    if (name, str(found)) != (project, version):
        raise PublishError(f"sdist {sdist}: expected one of the wheels' release, {project} "
                           f"{version}; got {name} {found}. Nothing was uploaded")  # fmt: skip


def _publish_copies(
    copies: PrivateCopies,
    index: IndexTarget,
    project: str,
    version: str,
    metadata_dir: Path,
    tuf: TufRepository | None,
    limits: NetworkLimits,
) -> PublishReport:
    release = f"{project} {version}"
    local = copies.digests
    # Every folder this publish writes after its uploads is tried now, so that a folder it
    # cannot write refuses the publish before anything is uploaded (not with a traceback after).
    plan = plan_storage(copies, metadata_dir, project, version,
                        writes=[tuf.metadata_dir] if tuf else [])  # fmt: skip
    if tuf is not None:
        # What the targets will be: the statement kept and the attestations it names.
        targets = _tuf_targets(copies.wheels, plan.kept, plan.attachments, (project, version))
        tuf.check(targets, digests=local)

    present = list_project_files(index.simple_url, project, limits=limits)
    _check_index(present, local, index, project, version)
    missing = sorted(name for name in local if name not in present)

    # The intent, recorded before the first upload: the first statement stored for a version
    # fixes its files (checked above), so a publish killed midway is completed by running it
    # again and no other set of files can take the version over.
    kept = store_intent(copies, metadata_dir, project, version)

    files = tuple(
        PublishedFile(name, local[name], UPLOADED if name in missing else ALREADY_PRESENT)
        for name in sorted(local)
    )
    done = _Done(release, files, kept.stored)
    _upload(copies, index, missing, done, limits)
    if missing:
        after = list_project_files(index.simple_url, project, limits=limits)
        for name in missing:
            if after.get(name) != local[name]:
                raise PublishError(
                    f"after uploading {name} the index lists sha256 {after.get(name)}, "
                    f"expected {local[name]}; {done.before_failure()}"
                )

    tuf_update = None
    if tuf is not None:
        targets = _tuf_targets(copies.wheels, kept.statement, kept.attachments, (project, version))
        try:
            tuf_update = tuf.add_targets(targets, digests=local)
        except ReleaseError as exc:
            raise PublishError(
                f"{exc}. {done.before_failure()}; once the cause is fixed, the same publish run "
                "again completes the TUF commit (the files already on the index are skipped)"
            ) from None
    return PublishReport(
        project=project,
        version=version,
        files=files,
        envelope_path=kept.statement,
        envelope_stored=kept.stored,
        message=done.message(tuf_update),
        tuf=tuf_update,
    )


def _upload(
    copies: PrivateCopies,
    index: IndexTarget,
    missing: Sequence[str],
    done: _Done,
    limits: NetworkLimits,
) -> None:
    """Uploads the ``missing`` files in order; a refused one fails the publish naming what this
    run uploaded before it."""
    for name in tracked(missing, "uploads"):
        try:
            twine_upload.upload(copies.wheels[name], index.url, index.username, index.password,
                                limits=limits)  # fmt: skip
        except ReleaseError as exc:
            raise PublishError(
                f"{exc}. {done.before_failure(upto=name)}; once the cause is fixed, the same "
                "publish run again completes it (the files already on the index are skipped)"
            ) from None
        pause_for_tests(PAUSE_ENV)


def _check_index(
    present: Mapping[str, str],
    local: Mapping[str, str],
    index: IndexTarget,
    project: str,
    version: str,
) -> None:
    """PublishError, before anything is uploaded, when the index has a file of this publish with
    other bytes, or a file of this version (as pip compares versions) that it does not give."""
    conflicts = [
        f"{name} (index sha256 {present[name]}, local sha256 {digest})"
        for name, digest in sorted(local.items())
        if name in present and present[name] != digest
    ]
    if conflicts:
        note = index.overwrite_note()
        raise PublishError(
            f"refusing to publish {project} {version}: the index already has different bytes "
            f"under the same file name: {'; '.join(conflicts)}. Nothing was uploaded; published "
            f"files are never replaced{f' ({note})' if note else ''} (bump the version, or "
            "rebuild reproducibly)"
        )
    others = sorted(n for n in present if n not in local and of_version(n, project, version))
    if others:
        raise PublishError(
            f"refusing to publish {project} {version}: the index already has files of this "
            f"version that this publish does not give: {', '.join(others)} (pip takes each for "
            f"{project}=={version}). Nothing was uploaded; published files are never replaced "
            "(bump the version)"
        )


def _tuf_targets(
    wheels: Mapping[str, Path],
    statement: Path,
    attached: Mapping[str, Path],
    release: tuple[str, str],
) -> dict[str, Path]:
    """TUF target path to local file: the wheels, and under provenance/ the statement and the
    attestations it names, of ``release`` (project, version)."""
    project, version = normalize_project(release[0]), version_key(release[1])
    return {
        **wheels,
        statement_target(project, version): statement,
        **{attestation_target(project, version, name): path for name, path in attached.items()},
    }


@dataclass(frozen=True)
class _Done:
    """What one publish changes, said truthfully in its message and in its failures: the files
    it uploads, the statement it stores, the TUF commit it makes."""

    release: str  # "<project> <version>"
    files: tuple[PublishedFile, ...]
    statement_stored: bool

    def message(self, tuf: TufUpdate | None) -> str:
        """The publish's message once it is done."""
        committed = tuf is not None and tuf.committed
        if not self._uploaded() and not self.statement_stored and not committed:
            return f"{self.release} already exists on the index; nothing uploaded"
        parts = [self._uploads(), *self._statement()]
        if tuf is not None:
            parts.append(self._tuf(tuf))
        return f"{self.release}: " + "; ".join(parts)

    def before_failure(self, upto: str | None = None) -> str:
        """What this publish had changed when it failed (at the upload of ``upto``, or after
        its uploads)."""
        if upto is None:
            uploaded = self._uploaded()
        else:
            uploaded = self._uploaded()[: self._uploaded().index(upto)]
        parts = [
            f"this publish had uploaded {len(uploaded)} file(s): {', '.join(uploaded)}"
            if uploaded
            else "this publish had uploaded nothing",
            *self._statement(),
        ]
        return "; ".join(parts)

    def _uploaded(self) -> list[str]:
        return [f.filename for f in self.files if f.outcome == UPLOADED]

    def _uploads(self) -> str:
        uploaded = self._uploaded()
        present = [f.filename for f in self.files if f.outcome == ALREADY_PRESENT]
        if not uploaded:
            return f"all {len(present)} file(s) were already on the index, identical"
        text = f"uploaded {len(uploaded)} file(s): {', '.join(uploaded)}"
        if present:
            text += f"; {len(present)} already present, identical: {', '.join(present)}"
        return text

    def _statement(self) -> list[str]:
        return ["stored its signed statement"] if self.statement_stored else []

    def _tuf(self, tuf: TufUpdate) -> str:
        versions = f"targets version {tuf.targets_version}, timestamp {tuf.timestamp_version}"
        if not tuf.committed:
            return f"the TUF metadata already named every file ({versions})"
        if not tuf.added:
            return f"signed a new TUF snapshot and timestamp, the targets unchanged ({versions})"
        if self._uploaded():
            return f"committed {len(tuf.added)} new TUF target(s) ({versions})"
        return f"completed the TUF commit: {len(tuf.added)} new target(s) ({versions})"
