"""Where a version's signed statement and the gate attestations it names are stored beside the
index, and how: the first statement stored fixes the version's files and is never replaced; the
attestations it names are stored before it, and one no stored statement names (left by a
publish killed before its statement) is replaced. What is stored is a publish's private copies
(``PrivateCopies``, checked as they are made: the bytes the caller hashed, and a statement of
exactly them), planned once before the first upload (``plan_storage``) and written whole under a
lock (``store_intent``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from release.errors import PublishError, ReleaseError, SigningError, WriteError
from release.statement import SUFFIX, SignedStatement, Statement, read_statement_unverified
from release.trust.release_version import (
    normalize_project,
    release_folder,
    same_version,
    statement_file,
    version_key,
)
from release.util.digests import sha256_file
from release.util.pauses import pause_for_tests

# Tests only: seconds to sleep after storing the attestations, before the statement.
PAUSE_BEFORE_STATEMENT_ENV = "ACTIVEKV_TEST_PAUSE_BEFORE_STATEMENT_S"
# Held while a publish stores a version's attestations and statement: one publisher at a time
# decides which statement is kept and makes the stored attestations its own. A hidden name,
# which the embedded index does not serve.
LOCK_NAME = ".publish.lock"


def envelope_path_for(metadata_dir: Path, project: str, version: str) -> Path:
    """Where the signed statement of ``project`` ``version`` is stored."""
    return metadata_dir / statement_file(project, version_key(version))


def attachments_dir_for(metadata_dir: Path, project: str, version: str) -> Path:
    """Where the gate attestations of ``project`` ``version`` are stored, beside its statement."""
    return metadata_dir / release_folder(normalize_project(project), version_key(version))


@dataclass(frozen=True)
class PrivateCopies:
    """The private copies a publish checks, stores and uploads, and their digests; made, they
    are the bytes the caller hashed, and their statement names exactly them."""

    wheels: dict[str, Path]
    digests: dict[str, str]
    statement: Path
    attachments: dict[str, Path]
    attachment_digests: dict[str, str]

    @classmethod
    def make(
        cls,
        folder: Path,
        wheels: Sequence[Path],
        envelope: Path,
        attachments: Mapping[str, Path],
        *,
        version: str,
        hashed: Mapping[str, str] | None = None,
        signed: SignedStatement | None = None,
    ) -> PrivateCopies:
        """Copies of `wheels` (and the sdist among them), `envelope` and `attachments` in
        `folder`; PublishError, before anything is uploaded, where a copy is not what the
        caller `hashed` (name to sha256, as its gates judged them) or the statement is not of
        `version` and of exactly these files. `signed`: `envelope` as the caller read and
        verified it, taken where the copy holds those very bytes (else the copy is read)."""
        # mkdtemp made ``folder`` its owner's alone: no one else can change a copy once checked.
        copied = {w.name: _copy(w, folder / "wheels" / w.name, "wheel") for w in wheels}
        statement = _copy(envelope, folder / "statement" / envelope.name, "envelope")
        attached = {name: _copy(path, folder / "attestations" / attachment_name(name),
                                "attestation") for name, path in attachments.items()}  # fmt: skip
        copies = cls(
            wheels=copied,
            digests={name: sha256_file(path) for name, path in copied.items()},
            statement=statement,
            attachments=attached,
            attachment_digests={name: sha256_file(path) for name, path in attached.items()},
        )
        if hashed is not None:
            _check_unchanged(wheels, copies.digests, hashed)
        copies._check_statement(envelope, version, signed)
        return copies

    def _check_statement(
        self, envelope: Path, version: str, signed: SignedStatement | None
    ) -> None:
        """PublishError unless the statement to publish is of ``version`` and names exactly the
        files and the attestations copied, with their digests."""
        try:
            statement = _statement_of_copy(self.statement, signed)
            named = statement.subjects
        except ReleaseError as exc:
            raise PublishError(f"the envelope to publish cannot be read: {exc}") from None
        problems = _mismatches(named, self.digests)
        problems += _mismatches(named_attestations(statement, envelope), self.attachment_digests)
        if not same_version(statement.version, version):
            problems.append(f"it is of version {statement.version!r}, not {version}")
        if problems:
            raise PublishError(
                f"the envelope to publish ({envelope}) does not cover exactly the files to "
                f"publish: {'; '.join(problems)}. Nothing was uploaded"
            )


def _check_unchanged(
    files: Sequence[Path], copied: Mapping[str, str], hashed: Mapping[str, str]
) -> None:
    """PublishError naming each file whose bytes, as copied to publish, are not the ones the
    caller hashed (and its gates judged): it changed in between."""
    changed = [
        f"{file} (hashed before: sha256 {hashed.get(file.name)}; copied to publish: sha256 "
        f"{copied[file.name]})"
        for file in files
        if hashed.get(file.name) != copied[file.name]
    ]
    if changed:
        raise PublishError(
            f"files: expected the bytes hashed before publishing; got other bytes, so they "
            f"changed since: {'; '.join(changed)}. Nothing was uploaded"
        )


def _statement_of_copy(copy: Path, signed: SignedStatement | None) -> Statement:
    """The statement of the private copy to publish: `signed`'s where the copy holds the bytes
    that verified, else read from the copy."""
    if signed is not None and signed.at(copy, sha256_file(copy)) is not None:
        return signed.statement
    return read_statement_unverified(copy)


def _mismatches(named: Mapping[str, str], given: Mapping[str, str]) -> list[str]:
    """Each file the statement names other than given: other digest, not named, not given."""
    return [
        f"{name} ("
        + (f"local sha256 {given[name]}, " if name in given else "not given, ")
        + (f"statement sha256 {named[name]})" if name in named else "statement does not name it)")
        for name in sorted(set(named) | set(given))
        if named.get(name) != given.get(name)
    ]


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


def attachment_name(name: str) -> str:
    """``name`` when it is a plain file name (a statement's byproduct is stored under it)."""
    if not name or name != Path(name).name or name.startswith("."):
        raise PublishError(f"attestation name {name!r}: expected a plain file name, such as "
                           "payload.intoto.json")  # fmt: skip
    return name


@dataclass(frozen=True)
class StoragePlan:
    """What a publish will keep beside the index, decided before its first upload: the
    statement kept for the version (the one stored first, else this publish's copy) and, for
    each attestation it names, the file whose bytes will lie at its stored place."""

    kept: Path
    attachments: dict[str, Path]  # name -> the stored file, or this publish's copy


def plan_storage(
    copies: PrivateCopies,
    metadata_dir: Path,
    project: str,
    version: str,
    writes: Sequence[Path] = (),
) -> StoragePlan:
    """PublishError, before anything is uploaded, where the folders the statement and its
    attestations are stored in (and the others the publish `writes` after its uploads) cannot
    be written, where a statement stored first for the version names other files, or where an
    attestation it names is neither stored nor given; else the plan."""
    release = f"{project} {version}"
    attached_dir = attachments_dir_for(metadata_dir, project, version)
    _check_writable([metadata_dir, attached_dir, *writes])
    stored = stored_statement(metadata_dir, project, version)
    if stored is not None:
        check_same_files(stored, copies.digests, release=release)
    kept = stored or copies.statement
    return StoragePlan(kept, attachment_plan(kept, attached_dir, copies, release))


@dataclass(frozen=True)
class Stored:
    """What store_intent kept: the version's statement, whether this call stored it, and where
    each attestation the statement names lies."""

    statement: Path
    stored: bool
    attachments: dict[str, Path]


def store_intent(copies: PrivateCopies, metadata_dir: Path, project: str, version: str) -> Stored:
    """Store the attestations the kept statement names, then the statement unless one is kept
    already."""
    release = f"{project} {version}"
    attached_dir = attachments_dir_for(metadata_dir, project, version)
    with _locked(metadata_dir):
        stored = stored_statement(metadata_dir, project, version)
        if stored is not None:  # a concurrent publish may have stored its own intent meanwhile
            check_same_files(stored, copies.digests, release=release)
            return Stored(stored, False, _settle_attachments(stored, attached_dir, copies, release))
        attached = _settle_attachments(copies.statement, attached_dir, copies, release)
        pause_for_tests(PAUSE_BEFORE_STATEMENT_ENV)
        destination = envelope_path_for(metadata_dir, project, version)
        if _place(copies.statement, destination, replace=False):
            return Stored(destination, True, attached)
        # Stored meanwhile by a publisher that does not share this lock (another host): it must
        # name these files, and the attestations stored must be the ones it names.
        check_same_files(destination, copies.digests, release=release)
        attached = _settle_attachments(destination, attached_dir, copies, release)
        return Stored(destination, False, attached)


def _settle_attachments(
    statement: Path, attached_dir: Path, copies: PrivateCopies, release: str
) -> dict[str, Path]:
    """Make the stored attestations the ones ``statement`` names (see attachment_plan); where
    each now lies."""
    plan = attachment_plan(statement, attached_dir, copies, release)
    for name, source in plan.items():
        if source != attached_dir / name:
            _place(source, attached_dir / name, replace=True)
    return {name: attached_dir / name for name in plan}


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


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK_NAME).open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def stored_statement(metadata_dir: Path, project: str, version: str) -> Path | None:
    """The statement stored for ``project`` ``version``, under any spelling of that version."""
    exact = envelope_path_for(metadata_dir, project, version)
    if exact.exists():
        return exact
    prefix = f"{normalize_project(project)}-"
    if not metadata_dir.is_dir():
        return None
    for path in sorted(metadata_dir.glob(f"{prefix}*{SUFFIX}")):
        with contextlib.suppress(InvalidVersion):
            if Version(path.name[len(prefix) : -len(SUFFIX)]) == Version(version):
                return path
    return None


def attachment_plan(
    statement: Path, attached_dir: Path, copies: PrivateCopies, release: str
) -> dict[str, Path]:
    """For each attestation ``statement`` names, the file whose bytes will lie at its stored
    place: the stored one when it is what the statement names, else this publish's copy when that
    is (the stored one is then an orphan of a killed publish, or missing); PublishError when
    neither is."""
    plan: dict[str, Path] = {}
    for name, digest in sorted(byproducts(statement).items()):
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


def byproducts(statement: Path) -> dict[str, str]:
    """Name to sha256 of each gate attestation the statement in ``statement`` names."""
    try:
        document = read_statement_unverified(statement)
    except ReleaseError as exc:
        raise PublishError(f"{statement}: cannot be read: {exc}") from None
    return named_attestations(document, statement)


def named_attestations(statement: Statement, where: Path) -> dict[str, str]:
    """Name to sha256 of each gate attestation ``statement`` (read from ``where``) names."""
    try:
        return {attachment_name(b.name): b.sha256 for b in statement.byproducts}
    except SigningError as exc:
        raise PublishError(f"{where}: {exc}") from None


def check_same_files(stored: Path, local: Mapping[str, str], *, release: str) -> None:
    """PublishError unless the statement stored first for ``release`` names exactly ``local``."""
    try:
        named = read_statement_unverified(stored).subjects
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
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
    except OSError as error:
        raise WriteError(f"writing {destination}: {error.strerror or error}") from None
    try:
        try:
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
            os.chmod(tmp, 0o644)
        except OSError as error:
            raise WriteError(f"writing {destination}: {error.strerror or error}") from None
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
