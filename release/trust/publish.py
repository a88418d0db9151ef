"""Publish step: upload wheels to a package index with twine, never replacing a published file,
and store the signed statement (DSSE envelope) of the version next to the index.

Rules:
* A file the index already has with different bytes refuses the whole publish; nothing is
  uploaded.
* A file the index already has with identical bytes is not uploaded again.
* The first publish of a version stores its statement before its first upload: that statement
  fixes the version's files (names and digests). It is never overwritten, and a publish that gives
  another set of files is refused before anything is uploaded.
* The index stores an upload whole or not at all (release/scripts/index_server.py); a refused
  upload names what the index answered (release/trust/twine_upload.py).
* After uploading, the index's listing must show every file with its local digest.
* Then the TUF repository (when given) names every file and the statement as targets; its
  timestamp is the commit point, so a publish killed between two uploads, or before that, is
  completed by running it again (the files already there are skipped as identical).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from release.errors import PublishError, ReleaseError
from release.trust import twine_upload
from release.trust.attestation import attestation_target, release_folder
from release.trust.index import list_project_files, normalize_project
from release.trust.sign import read_statement_unverified, subject_digests
from release.trust.tuf_metadata import PROVENANCE_PREFIX, TufRepository, TufUpdate
from release.util.digests import sha256_file
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


def envelope_path_for(metadata_dir: Path, project: str, version: str) -> Path:
    """Where the signed statement of ``project`` ``version`` is stored."""
    return metadata_dir / f"{normalize_project(project)}-{version}.intoto.json"


def publish(
    wheels: Sequence[Path],
    index: IndexTarget,
    *,
    envelope: Path,
    metadata_dir: Path,
    tuf: TufRepository | None = None,
    digests: Mapping[str, str] | None = None,
    attachments: Mapping[str, Path] | None = None,
) -> PublishReport:
    """Upload the ``wheels`` not yet on ``index``, store ``envelope`` for their version and make
    both TUF targets of ``tuf``. ``digests`` are the wheels' sha256 as the caller just hashed
    them; without them they are hashed here. ``attachments`` (name -> file: the gate
    attestations the statement names) are stored beside the statement, once, as targets too."""
    project, version = _project_and_version(wheels)
    attached_dir = attachments_dir_for(metadata_dir, project, version)
    attached = {name: attached_dir / name for name in attachments or {}}
    local = dict(digests) if digests is not None else {w.name: sha256_file(w) for w in wheels}
    paths = {wheel.name: wheel for wheel in wheels}
    _check_envelope_names(envelope, local, what="the envelope to publish")
    stored_path = envelope_path_for(metadata_dir, project, version)
    # Every folder this publish writes after its uploads, tried now, so that a folder it cannot
    # write refuses the publish before anything is uploaded (not with a traceback after).
    folders = [metadata_dir, attached_dir] if attached else [metadata_dir]
    _check_writable([*folders, *([tuf.metadata_dir] if tuf is not None else [])])
    if stored_path.exists():
        _check_same_files(stored_path, local, release=f"{project} {version}")
    if tuf is not None:
        # What the targets will be: a file already stored stays (the first publish's is kept).
        pending = {n: p if p.exists() else (attachments or {})[n] for n, p in attached.items()}
        tuf.check(_tuf_targets(paths, stored_path if stored_path.exists() else envelope, pending,
                               (project, version)), digests=local)  # fmt: skip

    present = list_project_files(index.simple_url, project)
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
    missing = sorted(name for name in local if name not in present)

    # The intent, recorded before the first upload: the first statement stored for a version
    # fixes its files (checked above), so a publish killed midway is completed by running it
    # again and no other set of files can take the version over.
    for name, local_file in (attachments or {}).items():
        _store_once(local_file, attached[name])
    envelope_stored = _store_once(envelope, stored_path)
    if not envelope_stored:  # a concurrent publish may have stored its own intent meanwhile
        _check_same_files(stored_path, local, release=f"{project} {version}")

    for name in tracked(missing, "uploads"):
        twine_upload.upload(paths[name], index.url, index.username, index.password)
        _test_pause()

    if missing:
        after = list_project_files(index.simple_url, project)
        for name in missing:
            if after.get(name) != local[name]:
                raise PublishError(
                    f"after uploading {name} the index lists sha256 {after.get(name)}, "
                    f"expected {local[name]}"
                )

    tuf_update = None
    if tuf is not None:
        tuf_update = tuf.add_targets(
            _tuf_targets(paths, stored_path, attached, (project, version)), digests=local
        )
    files = tuple(
        PublishedFile(name, local[name], UPLOADED if name in missing else ALREADY_PRESENT)
        for name in sorted(local)
    )
    return PublishReport(
        project=project,
        version=version,
        files=files,
        envelope_path=stored_path,
        envelope_stored=envelope_stored,
        message=_message(project, version, files),
        tuf=tuf_update,
    )


def _check_writable(folders: Sequence[Path]) -> None:
    """PublishError naming the first folder a file cannot be written in: tried in the folder,
    or where a missing one would be made (nothing is left behind; permission bits say nothing
    for root, so a write is tried)."""
    for folder in folders:
        existing = next(p for p in (folder, *folder.parents) if p.exists() or p == p.parent)
        try:
            if not existing.is_dir():
                raise NotADirectoryError(20, "not a folder")
            with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-check-"):
                pass
        except OSError as exc:
            raise PublishError(
                f"{folder}: a publish writes here and cannot ({exc.strerror or exc}); nothing was "
                "uploaded"
            ) from None


def attachments_dir_for(metadata_dir: Path, project: str, version: str) -> Path:
    """Where the gate attestations of ``project`` ``version`` are stored, beside its statement."""
    return metadata_dir / release_folder(normalize_project(project), version)


def _tuf_targets(
    wheels: dict[str, Path], statement: Path, attached: Mapping[str, Path], release: tuple[str, str]
) -> dict[str, Path]:
    """TUF target path to local file: the wheels, and under provenance/ the statement and the
    attestations it names, of ``release`` (project, version)."""
    project, version = normalize_project(release[0]), release[1]
    return {
        **wheels,
        PROVENANCE_PREFIX + envelope_path_for(Path(), project, version).name: statement,
        **{attestation_target(project, version, name): path for name, path in attached.items()},
    }


def _test_pause() -> None:
    if seconds := os.environ.get(PAUSE_ENV):
        time.sleep(float(seconds))


def _project_and_version(wheels: Sequence[Path]) -> tuple[str, str]:
    if not wheels:
        raise PublishError("nothing to publish: no wheels given")
    seen: set[str] = set()
    releases: set[tuple[str, str]] = set()
    for wheel in wheels:
        if wheel.suffix != ".whl" or wheel.name.count("-") not in (4, 5):
            raise PublishError(f"{wheel}: not a wheel file name (name-version-tags.whl)")
        if wheel.name in seen:
            raise PublishError(f"{wheel.name} is given twice")
        seen.add(wheel.name)
        name, version = wheel.name.split("-")[:2]
        releases.add((normalize_project(name), version))
    if len(releases) != 1:
        listed = ", ".join(f"{n} {v}" for n, v in sorted(releases))
        raise PublishError(f"one publish is one project version; the wheels are of {listed}")
    return releases.pop()


def _check_envelope_names(envelope: Path, expected: dict[str, str], *, what: str) -> None:
    try:
        named = subject_digests(read_statement_unverified(envelope))
    except ReleaseError as exc:
        raise PublishError(f"{what} cannot be read: {exc}") from None
    problems = [
        f"{name} (local sha256 {digest}, statement "
        + (f"sha256 {named[name]})" if name in named else "does not name it)")
        for name, digest in sorted(expected.items())
        if named.get(name) != digest
    ]
    if problems:
        raise PublishError(
            f"{what} ({envelope}) does not cover the files to publish: {'; '.join(problems)}. "
            "Nothing was uploaded"
        )


def _check_same_files(stored: Path, local: Mapping[str, str], *, release: str) -> None:
    """PublishError unless the statement stored first for ``release`` names exactly ``local``."""
    try:
        named = subject_digests(read_statement_unverified(stored))
    except ReleaseError as exc:
        raise PublishError(f"the stored statement of {release} cannot be read: {exc}") from None
    if named == dict(local):
        return
    extra = sorted(set(local) - set(named))
    absent = sorted(set(named) - set(local))
    other = sorted(n for n in set(named) & set(local) if named[n] != local[n])
    differences = [
        f"{label}: {', '.join(names)}"
        for label, names in (
            ("not in it", extra),
            ("in it but not given", absent),
            ("other bytes", other),
        )
        if names
    ]
    raise PublishError(
        f"refusing to publish {release}: its files were fixed by the first publish that started "
        f"it ({stored}) and this publish gives another set ({'; '.join(differences)}). Nothing "
        "was uploaded; re-run that publish with its wheels to complete it, or bump the version"
    )


def _store_once(envelope: Path, destination: Path) -> bool:
    """Copy ``envelope`` to ``destination`` unless it exists; True when this call stored it.

    Written to a temporary file and hard-linked into place, so a reader never sees a partial
    file and an existing file is never replaced, even by a concurrent publish.
    """
    if destination.exists():
        return False
    data = envelope.read_bytes()
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, destination)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _message(project: str, version: str, files: tuple[PublishedFile, ...]) -> str:
    uploaded = [f.filename for f in files if f.outcome == UPLOADED]
    present = [f.filename for f in files if f.outcome == ALREADY_PRESENT]
    if not uploaded:
        return f"{project} {version} already exists on the index; nothing uploaded"
    text = f"{project} {version}: uploaded {len(uploaded)} file(s): {', '.join(uploaded)}"
    if present:
        text += f"; {len(present)} already present, identical: {', '.join(present)}"
    return text
