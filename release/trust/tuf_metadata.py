"""The publisher's TUF repository: python-tuf metadata (root, targets, snapshot, timestamp) over
every file the index serves for the project, and over the signed statements of its versions.

Layout under ``<state_dir>/index/tuf/`` (the embedded index serves ``metadata/`` at
``<index>/tuf/metadata/``; see :mod:`release.scripts.index_server`):

* ``keys/<role>.pem`` (0600) and ``keys/<role>.pub.json``: one ed25519 key per top-level role,
  generated on first use (dev keys; the directory is never served) -- unless the manifest's
  ``[publish.tuf_keys.<role>]`` give key references (``file:``, signer URIs), which the
  ``stable`` channel requires (see :func:`repository_for`);
* ``metadata/1.root.json`` (the root a consumer bootstraps from), ``metadata/<v>.targets.json``,
  ``metadata/<v>.snapshot.json`` and ``metadata/timestamp.json``.

Consistent snapshots are on: every targets and snapshot version is a new file and never
rewritten after ``timestamp.json`` names it, so replacing ``timestamp.json`` (atomically, last) is
the single commit point of an update. A publish killed half-way leaves the previous state served;
the next publish completes it. A target is never given other hashes than it was first published
with.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from securesystemslib.signer import Key, Signer
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization import DeserializationError, SerializationError
from tuf.api.serialization.json import JSONSerializer

from release.errors import PublishError, ReleaseError, WriteError
from release.manifest import TufKeys
from release.trust.sign import generated_key_pair, load_public_key, load_signer
from release.util.atomic import atomic_write

ROLES = (Root.type, Targets.type, Snapshot.type, Timestamp.type)
TRUSTED_ROOT = "1.root.json"
_PROTECTED_CHANNEL = "stable"


@dataclass(frozen=True)
class Expiry:
    """How long each role's metadata is valid after it is signed."""

    root: timedelta = timedelta(days=365)
    targets: timedelta = timedelta(days=90)
    snapshot: timedelta = timedelta(days=7)
    timestamp: timedelta = timedelta(days=1)

    def of(self, role: str) -> timedelta:
        return {
            Root.type: self.root,
            Targets.type: self.targets,
            Snapshot.type: self.snapshot,
            Timestamp.type: self.timestamp,
        }[role]


@dataclass(frozen=True)
class TufUpdate:
    """What one :meth:`TufRepository.add_targets` call changed."""

    added: tuple[str, ...]
    targets_version: int
    timestamp_version: int
    committed: bool  # False: the metadata already described these files; nothing was signed


@dataclass
class TufRepository:
    """The TUF metadata of one index, kept in ``directory``; see the module's documentation."""

    directory: Path
    expiry: Expiry = field(default_factory=Expiry)
    # Each role's signer and public key; None: keys generated under ``keys_dir`` (dev).
    signers: Mapping[str, tuple[Signer, Key]] | None = None
    # Where generated keys live (default ``directory/keys``): elsewhere when ``directory`` is
    # itself served, as a remote index's ``tuf_dir`` is.
    keys_directory: Path | None = None
    # The signers :meth:`check` loaded, for the commit that follows it (a key that goes missing
    # in between does not fail the commit after the uploads).
    _loaded: dict[str, tuple[Signer, Key]] | None = field(default=None, init=False, repr=False)

    @property
    def metadata_dir(self) -> Path:
        return self.directory / "metadata"

    @property
    def keys_dir(self) -> Path:
        return self.keys_directory or self.directory / "keys"

    @property
    def trusted_root_path(self) -> Path:
        """The root metadata a consumer needs, given out of band, to verify anything."""
        return self.metadata_dir / TRUSTED_ROOT

    # ----------------------------------------------------------------------- public API

    def add_targets(
        self,
        files: Mapping[str, Path],
        *,
        now: datetime | None = None,
        force: bool = False,
        digests: Mapping[str, str] | None = None,
    ) -> TufUpdate:
        """Make ``files`` (target path to local file) TUF targets, and sign a new snapshot and
        timestamp when anything changed, the timestamp is past half its validity, or ``force``.
        ``digests`` (target path to sha256) are the caller's, for files it hashed already.

        Refuses (PublishError, nothing written) a target path already published with other
        length or hashes.
        """
        moment = _now(now)
        with self._locked():
            signers = self._checked_signers()
            try:
                return self._commit(files, signers, moment, force=force, digests=digests)
            except WriteError as exc:
                timestamp = self.metadata_dir / f"{Timestamp.type}.json"
                raise PublishError(
                    f"TUF commit: {exc}; nothing was committed ({timestamp} is as it was)"
                ) from None

    def check(
        self, files: Mapping[str, Path] | None = None, digests: Mapping[str, str] | None = None
    ) -> None:
        """PublishError unless the committed metadata (if any) can be read, every role's signer
        loads (dev keys are generated here on first use) and is the one the root names, and no
        path of ``files`` is a target with other bytes: run before uploading, so that a publish
        this repository would refuse is refused before anything changes. The signers stay
        loaded for the commit."""
        with self._locked():
            targets = self._committed().targets.signed if self._initialised() else None
            self._checked_signers()
            if targets is not None:
                self._refuse_conflicts(targets, _target_files(files or {}, digests))

    def refresh_timestamp(self, *, now: datetime | None = None) -> TufUpdate:
        """Sign a new snapshot and timestamp valid from ``now`` (keeps an idle index fresh)."""
        return self.add_targets({}, now=now, force=True)

    def targets(self) -> dict[str, TargetFile]:
        """The committed targets (path to info), as a consumer would see them."""
        with self._locked():
            if not self._initialised():
                return {}
            return dict(self._committed().targets.signed.targets)

    # ----------------------------------------------------------------------- internals

    def _commit(
        self,
        files: Mapping[str, Path],
        signers: Mapping[str, tuple[Signer, Key]],
        moment: datetime,
        *,
        force: bool,
        digests: Mapping[str, str] | None,
    ) -> TufUpdate:
        """:meth:`add_targets`, under the lock, with its signers loaded."""
        self._initialise(signers, moment)
        committed = self._committed()
        targets = committed.targets
        wanted = _target_files(files, digests)
        self._refuse_conflicts(targets.signed, wanted)
        added = tuple(p for p in wanted if p not in targets.signed.targets)
        stale = committed.timestamp.signed.expires - moment < self.expiry.timestamp / 2
        if not added and not stale and not force:
            return TufUpdate((), targets.signed.version, committed.timestamp.signed.version,
                             committed=False)  # fmt: skip
        if added:
            for path in added:
                targets.signed.targets[path] = wanted[path]
            targets.signed.version += 1
            self._sign_and_write_versioned(targets, signers, moment)
        snapshot = committed.snapshot
        snapshot.signed.meta[f"{Targets.type}.json"] = MetaFile(targets.signed.version)
        snapshot.signed.version += 1
        self._sign_and_write_versioned(snapshot, signers, moment)
        timestamp = committed.timestamp
        timestamp.signed.snapshot_meta = MetaFile(snapshot.signed.version)
        timestamp.signed.version += 1
        self._sign_and_write(timestamp, signers, moment, f"{Timestamp.type}.json")
        return TufUpdate(added, targets.signed.version, timestamp.signed.version,
                         committed=True)  # fmt: skip

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time: publishes to the same index are serialised."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / ".lock").open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _initialised(self) -> bool:
        return (self.metadata_dir / f"{Timestamp.type}.json").exists()

    def _check_keys(self) -> None:
        """The root names each role's key (a replaced key would sign unverifiable data)."""
        root = self._read(TRUSTED_ROOT, Root).signed
        for role in ROLES:
            if self.signers is not None:
                where, keyid = f"[publish.tuf_keys.{role}]", self.signers[role][1].keyid
            else:
                public = self.keys_dir / f"{role}.pub.json"
                try:
                    where, keyid = str(public), load_public_key(public).keyid
                except ReleaseError as exc:
                    raise PublishError(f"TUF {role} key: {exc}") from None
            if keyid not in root.roles[role].keyids:
                raise PublishError(
                    f"{where}: the TUF {role} key is not one the root "
                    f"{self.metadata_dir / TRUSTED_ROOT} names; restore the key (rotating a "
                    "key needs a new root version, which this pipeline does not do)"
                )

    def _refuse_conflicts(self, targets: Targets, wanted: Mapping[str, TargetFile]) -> None:
        conflicts = [
            f"{path} (published sha256 {_sha256(targets.targets[path])}, "
            f"now sha256 {_sha256(info)})"
            for path, info in sorted(wanted.items())
            if path in targets.targets and targets.targets[path] != info
        ]
        if conflicts:
            raise PublishError(
                f"{self.metadata_dir}: TUF targets already name other bytes for "
                f"{'; '.join(conflicts)}. Nothing was signed; published targets are never "
                "replaced"
            )

    def _checked_signers(self) -> dict[str, tuple[Signer, Key]]:
        """Each role's signer and key, checked against the root when there is one; loaded once
        (by :meth:`check`, before a publish uploads anything) and kept."""
        if self._initialised():
            self._check_keys()  # before _signers, which would generate a missing key
        if self._loaded is None:
            self._loaded = self._signers()
        return self._loaded

    def _signers(self) -> dict[str, tuple[Signer, Key]]:
        if self.signers is not None:
            return dict(self.signers)
        return {role: self._generated(role) for role in ROLES}

    def _generated(self, role: str) -> tuple[Signer, Key]:
        """The dev key of ``role`` under ``keys_dir``, generated on first use; PublishError
        naming the role and the file when it cannot be loaded or made."""
        pem = self.keys_dir / f"{role}.pem"
        try:
            self.keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            return generated_key_pair(pem, self.keys_dir / f"{role}.pub.json")
        except ReleaseError as exc:
            raise PublishError(f"TUF {role} key: {exc}") from None
        except OSError as exc:  # the key could not be written (no space, no permission)
            raise PublishError(
                f"TUF {role} key: {exc.filename or pem}: {exc.strerror or exc}"
            ) from None

    def _initialise(self, signers: Mapping[str, tuple[Signer, Key]], moment: datetime) -> None:
        """Write version 1 of every role unless a timestamp (the commit point) exists."""
        if self._initialised():
            return
        root = Metadata(Root(expires=moment + self.expiry.root, consistent_snapshot=True))
        for role, (_, key) in signers.items():
            root.signed.add_key(key, role)
        targets = Metadata(Targets(expires=moment + self.expiry.targets))
        snapshot = Metadata(Snapshot(expires=moment + self.expiry.snapshot))
        timestamp = Metadata(Timestamp(expires=moment + self.expiry.timestamp))
        self._sign_and_write_versioned(root, signers, moment)
        self._sign_and_write_versioned(targets, signers, moment)
        self._sign_and_write_versioned(snapshot, signers, moment)
        self._sign_and_write(timestamp, signers, moment, f"{Timestamp.type}.json")

    @dataclass(frozen=True)
    class _State:
        timestamp: Metadata[Timestamp]
        snapshot: Metadata[Snapshot]
        targets: Metadata[Targets]

    def _committed(self) -> TufRepository._State:
        """The state ``timestamp.json`` names (uncommitted files of a killed run are ignored)."""
        timestamp = self._read(f"{Timestamp.type}.json", Timestamp)
        snapshot = self._read(f"{timestamp.signed.snapshot_meta.version}.snapshot.json", Snapshot)
        targets_meta = snapshot.signed.meta[f"{Targets.type}.json"]
        targets = self._read(f"{targets_meta.version}.targets.json", Targets)
        return TufRepository._State(timestamp, snapshot, targets)

    def _read(self, name: str, kind: type[Root | Targets | Snapshot | Timestamp]) -> Metadata:
        path = self.metadata_dir / name
        try:
            metadata = Metadata.from_bytes(path.read_bytes())
        except OSError as exc:
            raise PublishError(f"{path}: TUF metadata cannot be read ({exc.strerror})") from None
        except DeserializationError as exc:
            raise PublishError(f"{path}: not TUF metadata ({exc})") from None
        if not isinstance(metadata.signed, kind):
            raise PublishError(
                f"{path}: expected {kind.type} metadata; it holds {metadata.signed.type}"
            )
        return metadata

    def _sign_and_write_versioned(
        self, metadata: Metadata, signers: Mapping[str, tuple[Signer, Key]], moment: datetime
    ) -> None:
        name = f"{metadata.signed.version}.{metadata.signed.type}.json"
        self._sign_and_write(metadata, signers, moment, name)

    def _sign_and_write(
        self,
        metadata: Metadata,
        signers: Mapping[str, tuple[Signer, Key]],
        moment: datetime,
        name: str,
    ) -> None:
        role = metadata.signed.type
        metadata.signed.expires = (moment + self.expiry.of(role)).replace(microsecond=0)
        metadata.signatures.clear()
        metadata.sign(signers[role][0])
        try:
            data = metadata.to_bytes(JSONSerializer(compact=False))
        except SerializationError as exc:
            raise PublishError(f"{role} metadata cannot be serialised ({exc})") from None
        atomic_write(self.metadata_dir / name, data)


def repository_for(
    directory: Path,
    keys: TufKeys | None,
    *,
    channel: str,
    state_dir: Path,
    manifest_dir: Path,
    keys_dir: Path | None = None,
) -> TufRepository:
    """The index's TUF repository as the manifest's ``[publish.tuf_keys]`` configure it.

    Without that table the roles' keys are generated under ``keys_dir`` (default
    ``directory/keys``; dev); the
    ``stable`` channel refuses them, as it refuses generated signing keys.
    """
    if keys is None:
        if channel == _PROTECTED_CHANNEL:
            raise PublishError(
                "publish.tuf_keys: expected a key reference for each TUF role (root, targets, "
                f"snapshot, timestamp) to publish on {channel!r}; generated dev keys never sign "
                f"for {channel!r}"
            )
        return TufRepository(directory, keys_directory=keys_dir)
    signers = {}
    for role in ROLES:
        spec = getattr(keys, role)
        if spec.generated:
            raise PublishError(
                f'publish.tuf_keys.{role}.key: "generate" is not a key reference here; leave '
                "[publish.tuf_keys] out to have the dev keys generated"
            )
        public = spec.public_key and manifest_dir / spec.public_key
        try:
            signers[role] = load_signer(
                spec.key, channel=channel, state_dir=state_dir, public_key=public
            )
        except ReleaseError as exc:
            raise PublishError(f"publish.tuf_keys.{role}: {exc}") from None
    return TufRepository(directory, signers=signers)


def _target_files(
    files: Mapping[str, Path], digests: Mapping[str, str] | None
) -> dict[str, TargetFile]:
    known = digests or {}
    return {
        path: _target_file(path, local, known.get(path)) for path, local in sorted(files.items())
    }


def _target_file(target_path: str, local: Path, digest: str | None = None) -> TargetFile:
    try:
        if digest is not None:  # hashed by the caller: its length is all that is read here
            return TargetFile(local.stat().st_size, {"sha256": digest}, target_path)
        return TargetFile.from_file(target_path, str(local), ["sha256"])
    except OSError as exc:
        raise PublishError(f"{local}: cannot be read for its TUF target ({exc.strerror})") from None


def _sha256(info: TargetFile) -> str:
    return info.hashes.get("sha256", "?")


def _now(now: datetime | None) -> datetime:
    moment = now or datetime.now(timezone.utc)
    return moment.astimezone(timezone.utc)
