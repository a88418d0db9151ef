"""Publish step: upload wheels to a package index with twine, never replacing a published file,
and store the signed statement (DSSE envelope) of the version next to the index.

Rules:
* One publish is one project version, known by its public version as pip compares versions:
  ``0.1`` and ``0.1.0`` are one version (their statements and index files are one release's),
  and a local version label (``0.1.0+hotfix``, which pip takes for ``==0.1.0``) is refused.
* Each wheel, the statement and each attestation is copied into a private folder first; what is
  hashed, checked and uploaded or stored is that copy, so a file changed after the check is not
  what reaches the index.
* The statement must name exactly the wheels given (names and digests), and exactly the
  attestations given.
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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from packaging.specifiers import Specifier
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

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
# Tests only: seconds to sleep after storing the attestations, before the statement.
PAUSE_BEFORE_STATEMENT_ENV = "ACTIVEKV_TEST_PAUSE_BEFORE_STATEMENT_S"


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


STATEMENT_SUFFIX = ".intoto.json"
# Held while a publish stores a version's attestations and statement: one publisher at a time
# decides which statement is kept and makes the stored attestations its own. A hidden name,
# which the embedded index does not serve.
LOCK_NAME = ".publish.lock"
# What pip reads as a source distribution (besides wheels), so as a file of some version.
_SDIST_EXTENSIONS = (".tar.gz", ".zip", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tlz", ".tar.lz",
                     ".tar.lzma", ".tgz", ".tar")  # fmt: skip


def version_key(version: str) -> str:
    """``version`` as stored file names spell it: PEP 440-normalised (``1.0-RC1`` is ``1.0rc1``)."""
    try:
        return str(Version(version))
    except InvalidVersion:
        raise PublishError(f"version {version!r}: expected a PEP 440 version") from None


def envelope_path_for(metadata_dir: Path, project: str, version: str) -> Path:
    """Where the signed statement of ``project`` ``version`` is stored."""
    return metadata_dir / f"{normalize_project(project)}-{version_key(version)}{STATEMENT_SUFFIX}"


def file_version(filename: str, project: str) -> Version | None:
    """The version of ``project`` that a file of its index page is, read from its name as pip
    reads it; None for a file pip would not take as one of ``project`` (another project, not a
    distribution, or a name pip cannot read)."""
    if filename.endswith(".whl"):
        try:
            name, version, _, _ = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            return None
        return version if name == normalize_project(project) else None
    stem = next((filename[: -len(e)] for e in _SDIST_EXTENSIONS if filename.endswith(e)), None)
    if stem is None:
        return None
    for cut, char in enumerate(stem):  # name-version, the name spelled any way pip accepts
        if char == "-" and normalize_project(stem[:cut]) == normalize_project(project):
            with contextlib.suppress(InvalidVersion):
                return Version(stem[cut + 1 :])
    return None


def of_version(filename: str, project: str, version: str) -> bool:
    """Whether pip takes ``filename`` for ``project==version``: the same version however it is
    spelled (``0.1`` for ``0.1.0``), and a local label of it (``0.1.0+hotfix``) too."""
    found = file_version(filename, project)
    return found is not None and Specifier(f"=={version}").contains(found, prereleases=True)


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
    both TUF targets of ``tuf``. ``digests`` are the wheels' sha256 as the caller hashed them (the
    bytes its gates judged): the copies published must still have them. ``attachments`` (name ->
    file: the gate attestations the statement names) are stored beside the statement, as
    targets too."""
    project, version = _project_and_version(wheels)
    with tempfile.TemporaryDirectory(prefix="activekv-publish-") as private:
        copies = _Copies.make(Path(private), wheels, envelope, attachments or {})
        if digests is not None:
            _check_unchanged(wheels, copies.digests, digests)
        _check_envelope(envelope, copies, version)
        return _publish_copies(copies, index, project, version, metadata_dir, tuf)


@dataclass(frozen=True)
class _Copies:
    """The private copies a publish checks, stores and uploads, and their digests."""

    wheels: dict[str, Path]
    digests: dict[str, str]
    statement: Path
    attachments: dict[str, Path]
    attachment_digests: dict[str, str]

    @classmethod
    def make(
        cls, folder: Path, wheels: Sequence[Path], envelope: Path, attachments: Mapping[str, Path]
    ) -> _Copies:
        # mkdtemp made ``folder`` its owner's alone: no one else can change a copy once checked.
        copied = {w.name: _copy(w, folder / "wheels" / w.name, "wheel") for w in wheels}
        statement = _copy(envelope, folder / "statement" / envelope.name, "envelope")
        attached = {name: _copy(path, folder / "attestations" / _attachment_name(name),
                                "attestation") for name, path in attachments.items()}  # fmt: skip
        return cls(
            wheels=copied,
            digests={name: sha256_file(path) for name, path in copied.items()},
            statement=statement,
            attachments=attached,
            attachment_digests={name: sha256_file(path) for name, path in attached.items()},
        )


def _copy(source: Path, destination: Path, what: str) -> Path:
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copyfile(source, destination)
    except OSError as exc:
        raise PublishError(
            f"{what} {source}: expected a readable file; got {exc.strerror or exc}. Nothing was "
            "uploaded"
        ) from None
    return destination


def _attachment_name(name: str) -> str:
    """``name`` when it is a plain file name (a statement's byproduct is stored under it)."""
    if not name or name != Path(name).name or name.startswith("."):
        raise PublishError(f"attestation name {name!r}: expected a plain file name, such as "
                           "payload.intoto.json")  # fmt: skip
    return name


def _check_unchanged(
    wheels: Sequence[Path], copied: Mapping[str, str], hashed: Mapping[str, str]
) -> None:
    """PublishError naming each wheel whose bytes, as copied to publish, are not the ones the
    caller hashed (and its gates judged): it changed in between."""
    changed = [
        f"{wheel} (hashed before: sha256 {hashed.get(wheel.name)}; copied to publish: sha256 "
        f"{copied[wheel.name]})"
        for wheel in wheels
        if hashed.get(wheel.name) != copied[wheel.name]
    ]
    if changed:
        raise PublishError(
            f"wheels: expected the bytes hashed before publishing; got other bytes, so they "
            f"changed since: {'; '.join(changed)}. Nothing was uploaded"
        )


def _publish_copies(
    copies: _Copies,
    index: IndexTarget,
    project: str,
    version: str,
    metadata_dir: Path,
    tuf: TufRepository | None,
) -> PublishReport:
    release = f"{project} {version}"
    local = copies.digests
    attached_dir = attachments_dir_for(metadata_dir, project, version)
    # Every folder this publish writes after its uploads, tried now, so that a folder it cannot
    # write refuses the publish before anything is uploaded (not with a traceback after).
    _check_writable([metadata_dir, attached_dir, *([tuf.metadata_dir] if tuf else [])])
    stored = _stored_statement(metadata_dir, project, version)
    if stored is not None:
        _check_same_files(stored, local, release=release)
    if tuf is not None:
        # What the targets will be: the statement kept and the attestations it names.
        kept = stored or copies.statement
        planned = _attachment_plan(kept, attached_dir, copies, release)
        tuf.check(_tuf_targets(copies.wheels, kept, planned, (project, version)), digests=local)

    present = list_project_files(index.simple_url, project)
    _check_index(present, local, index, project, version)
    missing = sorted(name for name in local if name not in present)

    # The intent, recorded before the first upload: the first statement stored for a version
    # fixes its files (checked above), so a publish killed midway is completed by running it
    # again and no other set of files can take the version over.
    stored_path, envelope_stored = _store_intent(copies, metadata_dir, project, version)

    for name in tracked(missing, "uploads"):
        twine_upload.upload(copies.wheels[name], index.url, index.username, index.password)
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
        attached = {name: attached_dir / name for name in _byproducts(stored_path)}
        tuf_update = tuf.add_targets(
            _tuf_targets(copies.wheels, stored_path, attached, (project, version)), digests=local
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


def _store_intent(
    copies: _Copies, metadata_dir: Path, project: str, version: str
) -> tuple[Path, bool]:
    """Store the attestations the kept statement names, then the statement unless one is kept
    already: (the stored statement, whether this call stored it)."""
    release = f"{project} {version}"
    attached_dir = attachments_dir_for(metadata_dir, project, version)
    with _locked(metadata_dir):
        stored = _stored_statement(metadata_dir, project, version)
        if stored is not None:  # a concurrent publish may have stored its own intent meanwhile
            _check_same_files(stored, copies.digests, release=release)
            _settle_attachments(stored, attached_dir, copies, release)
            return stored, False
        _settle_attachments(copies.statement, attached_dir, copies, release)
        _test_pause(PAUSE_BEFORE_STATEMENT_ENV)
        destination = envelope_path_for(metadata_dir, project, version)
        if _place(copies.statement, destination, replace=False):
            return destination, True
        # Stored meanwhile by a publisher that does not share this lock (another host): it must
        # name these files, and the attestations stored must be the ones it names.
        _check_same_files(destination, copies.digests, release=release)
        _settle_attachments(destination, attached_dir, copies, release)
        return destination, False


def _settle_attachments(statement: Path, attached_dir: Path, copies: _Copies, release: str) -> None:
    """Make the stored attestations the ones ``statement`` names (see _attachment_plan)."""
    for name, source in _attachment_plan(statement, attached_dir, copies, release).items():
        if source != attached_dir / name:
            _place(source, attached_dir / name, replace=True)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK_NAME).open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _stored_statement(metadata_dir: Path, project: str, version: str) -> Path | None:
    """The statement stored for ``project`` ``version``, under any spelling of that version."""
    exact = envelope_path_for(metadata_dir, project, version)
    if exact.exists():
        return exact
    prefix = f"{normalize_project(project)}-"
    if not metadata_dir.is_dir():
        return None
    for path in sorted(metadata_dir.glob(f"{prefix}*{STATEMENT_SUFFIX}")):
        with contextlib.suppress(InvalidVersion):
            if Version(path.name[len(prefix) : -len(STATEMENT_SUFFIX)]) == Version(version):
                return path
    return None


def _attachment_plan(
    statement: Path, attached_dir: Path, copies: _Copies, release: str
) -> dict[str, Path]:
    """For each attestation ``statement`` names, the file whose bytes will lie at its stored
    place: the stored one when it is what the statement names, else this publish's copy when that
    is (the stored one is then an orphan of a killed publish, or missing); PublishError when
    neither is."""
    plan: dict[str, Path] = {}
    for name, digest in sorted(_byproducts(statement).items()):
        stored = attached_dir / name
        stored_digest = sha256_file(stored) if stored.is_file() else None
        if stored_digest == digest:
            plan[name] = stored
        elif copies.attachment_digests.get(name) == digest:
            plan[name] = copies.attachments[name]
        else:
            there = f"sha256 {stored_digest}" if stored_digest else "nothing"
            given = copies.attachment_digests.get(name)
            raise PublishError(
                f"{stored}: the statement of {release} ({statement}) names this attestation "
                f"with sha256 {digest}; there is {there}, and this publish gives "
                + (f"sha256 {given}" if given else "none")
                + ". Nothing was uploaded; re-run the publish that stored that statement, with "
                "its attestations"
            )
    return plan


def _byproducts(statement: Path) -> dict[str, str]:
    """Name to sha256 of each gate attestation the statement in ``statement`` names."""
    try:
        document = read_statement_unverified(statement)
    except ReleaseError as exc:
        raise PublishError(f"{statement}: cannot be read: {exc}") from None
    return _named_attestations(document, statement)


def _named_attestations(statement: Mapping[str, Any], where: Path) -> dict[str, str]:
    try:
        entries = statement["predicate"]["runDetails"].get("byproducts", [])
        return {_attachment_name(e["name"]): e["digest"]["sha256"] for e in entries}
    except (KeyError, TypeError, AttributeError) as exc:
        raise PublishError(
            f"{where}: predicate.runDetails.byproducts: expected entries with a name and a "
            f"sha256 digest; got {type(exc).__name__}: {exc}"
        ) from None


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
    return metadata_dir / release_folder(normalize_project(project), version_key(version))


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
        PROVENANCE_PREFIX + envelope_path_for(Path(), project, version).name: statement,
        **{attestation_target(project, version, name): path for name, path in attached.items()},
    }


def _test_pause(variable: str = PAUSE_ENV) -> None:
    if seconds := os.environ.get(variable):
        time.sleep(float(seconds))


def _project_and_version(wheels: Sequence[Path]) -> tuple[str, str]:
    """(normalised project, normalised public version) of the wheels: one of each."""
    if not wheels:
        raise PublishError("nothing to publish: no wheels given")
    seen: set[str] = set()
    releases: set[tuple[str, str]] = set()
    for wheel in wheels:
        try:
            name, version, _, _ = parse_wheel_filename(wheel.name)
        except (InvalidWheelFilename, InvalidVersion):
            raise PublishError(f"{wheel}: not a wheel file name (name-version-tags.whl)") from None
        if wheel.name in seen:
            raise PublishError(f"{wheel.name} is given twice")
        seen.add(wheel.name)
        if version.local is not None:
            raise PublishError(
                f"{wheel.name}: expected a public version (PEP 440) to publish; got {version}, "
                f"whose local label +{version.local} pip also takes for =={version.public}"
            )
        releases.add((normalize_project(name), str(version)))
    if len(releases) != 1:
        listed = ", ".join(f"{n} {v}" for n, v in sorted(releases))
        raise PublishError(f"one publish is one project version; the wheels are of {listed}")
    return releases.pop()


def _check_envelope(envelope: Path, copies: _Copies, version: str) -> None:
    """PublishError unless the statement to publish is of ``version`` and names exactly the
    wheels and the attestations given, with their digests."""
    try:
        statement = read_statement_unverified(copies.statement)
        named = subject_digests(statement)
    except ReleaseError as exc:
        raise PublishError(f"the envelope to publish cannot be read: {exc}") from None
    problems = _mismatches(named, copies.digests)
    problems += _mismatches(_named_attestations(statement, envelope), copies.attachment_digests)
    signed = statement_version(statement)
    if not same_version(signed, version):
        problems.append(f"it is of version {signed!r}, not {version}")
    if problems:
        raise PublishError(
            f"the envelope to publish ({envelope}) does not cover exactly the files to publish: "
            f"{'; '.join(problems)}. Nothing was uploaded"
        )


def _mismatches(named: Mapping[str, str], given: Mapping[str, str]) -> list[str]:
    """Each file the statement names other than given: other digest, not named, not given."""
    return [
        f"{name} ("
        + (f"local sha256 {given[name]}, " if name in given else "not given, ")
        + (f"statement sha256 {named[name]})" if name in named else "statement does not name it)")
        for name in sorted(set(named) | set(given))
        if named.get(name) != given.get(name)
    ]


def statement_version(statement: Mapping[str, Any]) -> object:
    """The version a release's statement says it is of (None when it says none)."""
    try:
        return statement["predicate"]["buildDefinition"]["externalParameters"]["version"]
    except (KeyError, TypeError):
        return None


def same_version(signed: object, version: str) -> bool:
    """Whether ``signed`` (a statement's version) is ``version``, however either is spelled."""
    try:
        return isinstance(signed, str) and Version(signed) == Version(version)
    except InvalidVersion:
        return False


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


def _place(source: Path, destination: Path, *, replace: bool) -> bool:
    """Copy ``source`` to ``destination``; True when this call put it there. ``replace``: an
    existing file is replaced (renamed over); else it is kept and False returned.

    Written to a temporary file and renamed or hard-linked into place, so a reader never sees a
    partial file and, without ``replace``, an existing file is never replaced, even by a
    concurrent publish.
    """
    if not replace and destination.exists():
        return False
    data = source.read_bytes()
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o644)
        if replace:
            os.replace(tmp, destination)
            return True
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
