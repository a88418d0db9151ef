"""The consumer's side of the index's TUF repository, with python-tuf's ``ngclient.Updater``.

A consumer trusts one root metadata file, given out of band (the publisher's
``<state_dir>/index/tuf/metadata/1.root.json``). Everything else is downloaded and checked
against it: newer roots, timestamp, snapshot, targets. The metadata the consumer has seen is kept
in a cache directory, so an index that later serves an older timestamp (a rollback) is refused;
by default that directory belongs to the repository's root keys, whatever URL reaches it.

A URL with credentials, a query or a fragment in it is refused, as the manifest refuses one for an
index: every message names the URLs it reads, and a password or token must never be printed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tuf.api.exceptions import (
    BadVersionNumberError,
    DownloadError,
    ExpiredMetadataError,
    LengthOrHashMismatchError,
    RepositoryError,
    UnsignedMetadataError,
)
from tuf.api.metadata import Metadata, Root, TargetFile
from tuf.api.serialization import DeserializationError
from tuf.ngclient import Updater, UpdaterConfig

from release.errors import VerifyError
from release.util.urls import masked_url, url_secrets

# What a file the index serves but the TUF metadata does not name is.
UNKNOWN_FILE = "the index serves a file its publisher never signed (unknown file)"


def default_cache_dir(trusted_root: Metadata[Root]) -> Path:
    """Where the metadata seen of the repository with this root is remembered: keyed by the
    root role's keys and threshold, never by the URL, so the same repository reached at another
    port or host name cannot be rolled back."""
    role = trusted_root.signed.roles[Root.type]
    identity = json.dumps({"keyids": sorted(role.keyids), "threshold": role.threshold})
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "activekv" / "tuf" / key


def refuse_credentials(flag: str, url: str) -> None:
    """VerifyError naming ``flag`` when ``url`` may carry a secret (userinfo, query, fragment),
    as the manifest refuses such a URL for an index; the message masks it."""
    if found := url_secrets(url):
        raise VerifyError(
            f"{flag} {masked_url(url)}: expected a URL without credentials, query or fragment "
            f"(listing, downloading and the TUF metadata need none); got {' and '.join(found)}"
        )


def _why(error: BaseException) -> str:
    """An error's type and the first message along its causes: tuf's SlowRetrievalError says
    nothing itself, and a refused connection is one (urllib3's NewConnectionError is a
    ConnectTimeoutError); the urllib3 error under it names the URL and the reason."""
    cause: BaseException | None = error
    while cause is not None and not str(cause):
        cause = cause.__cause__
    return f"{type(error).__name__}: {cause if cause is not None else 'no detail'}"


class TrustedIndex:
    """The TUF targets of an index, checked from a trusted root; ``refresh`` before use."""

    def __init__(self, tuf_url: str, trusted_root: Path, cache_dir: Path | None = None) -> None:
        refuse_credentials("the TUF URL", tuf_url)
        self._tuf_url = tuf_url.rstrip("/") + "/"
        self.metadata_url = self._tuf_url + "metadata/"
        self.targets_url = self._tuf_url + "targets/"
        try:
            root = trusted_root.read_bytes()
        except OSError as exc:
            raise VerifyError(
                f"--root {trusted_root}: the trusted TUF root cannot be read ({exc.strerror})"
            ) from None
        self._root_path = trusted_root
        try:
            parsed = Metadata[Root].from_bytes(root)
            if not isinstance(parsed.signed, Root):
                raise ValueError(f"it is {parsed.signed.type!r} metadata")
        except (DeserializationError, ValueError, KeyError) as exc:
            raise VerifyError(f"--root {trusted_root}: not a valid, self-signed TUF root "
                              f"({type(exc).__name__}: {exc})") from None  # fmt: skip
        self.cache_dir = cache_dir or default_cache_dir(parsed)
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise VerifyError(f"--tuf-cache {self.cache_dir}: expected a folder (the TUF "
                              "metadata seen before); it is a file") from None  # fmt: skip
        except OSError as exc:
            raise VerifyError(f"--tuf-cache {self.cache_dir}: cannot make the folder "
                              f"({exc.strerror})") from None  # fmt: skip
        try:
            self._updater = Updater(
                metadata_dir=str(self.cache_dir),
                metadata_base_url=self.metadata_url,
                target_base_url=self.targets_url,
                # Wheels are downloaded by pip under their plain names, not hash-prefixed ones.
                config=UpdaterConfig(prefix_targets_with_hash=False),
                bootstrap=root,
            )
        except (RepositoryError, ValueError) as exc:
            raise VerifyError(
                f"--root {trusted_root}: not a valid, self-signed TUF root "
                f"({type(exc).__name__}: {exc})"
            ) from None

    def refresh(self) -> None:
        """Download and check root, timestamp, snapshot and targets; VerifyError on any attack."""
        try:
            self._updater.refresh()
        except ExpiredMetadataError as exc:
            raise VerifyError(
                f"TUF metadata from {self.metadata_url} has expired ({exc}); the index is stale "
                "or frozen: the publisher must re-sign it"
            ) from None
        except BadVersionNumberError as exc:
            raise VerifyError(
                f"TUF metadata from {self.metadata_url} is older than what this consumer has "
                f"already seen (rollback refused: {exc}); cache {self.cache_dir}"
            ) from None
        except UnsignedMetadataError as exc:
            raise VerifyError(
                f"TUF metadata from {self.metadata_url} is not signed by the keys of the trusted "
                f"root {self._root_path} ({exc}): wrong key, or another repository's root"
            ) from None
        except LengthOrHashMismatchError as exc:
            raise VerifyError(
                f"TUF metadata from {self.metadata_url} does not match its length or hash as "
                f"signed ({exc}): tampered metadata"
            ) from None
        except RepositoryError as exc:
            raise VerifyError(
                f"TUF metadata from {self.metadata_url} is refused ({type(exc).__name__}: {exc})"
            ) from None
        except DownloadError as exc:
            raise VerifyError(
                f"TUF metadata cannot be downloaded from {self.metadata_url} ({_why(exc)})"
            ) from None

    def target(self, target_path: str, *, unknown: str = UNKNOWN_FILE) -> TargetFile:
        """The signed length and hashes of ``target_path``; VerifyError when it is unknown,
        saying what that means (``unknown``)."""
        info = self._updater.get_targetinfo(target_path)
        if info is None:
            raise VerifyError(
                f"{target_path} is not a TUF target of {self.metadata_url}: {unknown}"
            )
        return info

    def check_file(self, path: Path) -> None:
        """``path`` (e.g. what pip downloaded) is the TUF target of its file name, byte for byte."""
        info = self.target(path.name)
        try:
            with path.open("rb") as stream:
                info.verify_length_and_hashes(stream)
        except LengthOrHashMismatchError as exc:
            raise VerifyError(
                f"{path.name} as served does not match its TUF target (signed sha256 "
                f"{info.hashes.get('sha256')}, length {info.length}; {exc}): tampered file"
            ) from None

    def download(self, target_path: str, destination: Path, *, unknown: str = UNKNOWN_FILE) -> Path:
        """Download ``target_path`` from ``<tuf_url>/targets/`` into ``destination``, checked;
        ``unknown`` says what a target the metadata does not name means."""
        info = self.target(target_path, unknown=unknown)
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            return Path(self._updater.download_target(info, str(destination)))
        except LengthOrHashMismatchError as exc:
            raise VerifyError(
                f"{target_path} from {self.targets_url} does not match its TUF target ({exc}): "
                "tampered file"
            ) from None
        except DownloadError as exc:
            raise VerifyError(
                f"{target_path} cannot be downloaded from {self.targets_url} ({_why(exc)})"
            ) from None
