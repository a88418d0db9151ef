"""Where a version's signed statement and the gate attestations it names are stored beside the
index, and how: the first statement stored fixes the version's files and is never replaced; the
attestations it names are stored before it, and one no stored statement names (left by a
publish killed before its statement) is replaced. What is stored is a publish's private copies
(``PrivateCopies``), written whole under a lock."""

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

from packaging.version import InvalidVersion, Version

from release.errors import PublishError, ReleaseError, SigningError, WriteError
from release.statement import Statement, read_statement_unverified
from release.trust.attestation import release_folder
from release.trust.index import normalize_project
from release.trust.release_version import version_key
from release.util.digests import sha256_file

# Tests only: seconds to sleep after storing the attestations, before the statement.
PAUSE_BEFORE_STATEMENT_ENV = "ACTIVEKV_TEST_PAUSE_BEFORE_STATEMENT_S"
STATEMENT_SUFFIX = ".intoto.json"
# Held while a publish stores a version's attestations and statement: one publisher at a time
# decides which statement is kept and makes the stored attestations its own. A hidden name,
# which the embedded index does not serve.
LOCK_NAME = ".publish.lock"


def envelope_path_for(metadata_dir: Path, project: str, version: str) -> Path:
    """Where the signed statement of ``project`` ``version`` is stored."""
    return metadata_dir / f"{normalize_project(project)}-{version_key(version)}{STATEMENT_SUFFIX}"


def attachments_dir_for(metadata_dir: Path, project: str, version: str) -> Path:
    """Where the gate attestations of ``project`` ``version`` are stored, beside its statement."""
    return metadata_dir / release_folder(normalize_project(project), version_key(version))


@dataclass(frozen=True)
class PrivateCopies:
    """The private copies a publish checks, stores and uploads, and their digests."""

    wheels: dict[str, Path]
    digests: dict[str, str]
    statement: Path
    attachments: dict[str, Path]
    attachment_digests: dict[str, str]

    @classmethod
    def make(
        cls, folder: Path, wheels: Sequence[Path], envelope: Path, attachments: Mapping[str, Path]
    ) -> PrivateCopies:
        # mkdtemp made ``folder`` its owner's alone: no one else can change a copy once checked.
        copied = {w.name: _copy(w, folder / "wheels" / w.name, "wheel") for w in wheels}
        statement = _copy(envelope, folder / "statement" / envelope.name, "envelope")
        attached = {name: _copy(path, folder / "attestations" / attachment_name(name),
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


def attachment_name(name: str) -> str:
    """``name`` when it is a plain file name (a statement's byproduct is stored under it)."""
    if not name or name != Path(name).name or name.startswith("."):
        raise PublishError(f"attestation name {name!r}: expected a plain file name, such as "
                           "payload.intoto.json")  # fmt: skip
    return name


def store_intent(
    copies: PrivateCopies, metadata_dir: Path, project: str, version: str
) -> tuple[Path, bool]:
    """Store the attestations the kept statement names, then the statement unless one is kept
    already: (the stored statement, whether this call stored it)."""
    release = f"{project} {version}"
    attached_dir = attachments_dir_for(metadata_dir, project, version)
    with _locked(metadata_dir):
        stored = stored_statement(metadata_dir, project, version)
        if stored is not None:  # a concurrent publish may have stored its own intent meanwhile
            check_same_files(stored, copies.digests, release=release)
            _settle_attachments(stored, attached_dir, copies, release)
            return stored, False
        _settle_attachments(copies.statement, attached_dir, copies, release)
        pause_for_tests(PAUSE_BEFORE_STATEMENT_ENV)
        destination = envelope_path_for(metadata_dir, project, version)
        if _place(copies.statement, destination, replace=False):
            return destination, True
        # Stored meanwhile by a publisher that does not share this lock (another host): it must
        # name these files, and the attestations stored must be the ones it names.
        check_same_files(destination, copies.digests, release=release)
        _settle_attachments(destination, attached_dir, copies, release)
        return destination, False


def _settle_attachments(
    statement: Path, attached_dir: Path, copies: PrivateCopies, release: str
) -> None:
    """Make the stored attestations the ones ``statement`` names (see attachment_plan)."""
    for name, source in attachment_plan(statement, attached_dir, copies, release).items():
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


def stored_statement(metadata_dir: Path, project: str, version: str) -> Path | None:
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


def pause_for_tests(variable: str) -> None:
    """Sleep the seconds ``variable`` names, if set (tests kill a publish in between)."""
    if seconds := os.environ.get(variable):
        time.sleep(float(seconds))
