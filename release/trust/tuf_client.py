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
import re
import urllib.error
from collections.abc import Iterator
from pathlib import Path

from tuf.api.exceptions import (
    BadVersionNumberError,
    DownloadError,
    DownloadHTTPError,
    ExpiredMetadataError,
    LengthOrHashMismatchError,
    RepositoryError,
    UnsignedMetadataError,
)
from tuf.api.metadata import Metadata, Root, TargetFile
from tuf.api.serialization import DeserializationError
from tuf.ngclient import FetcherInterface, Updater, UpdaterConfig

from release.errors import VerifyError
from release.manifest import NetworkLimits
from release.util import http
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


class LimitError(DownloadError):
    """A TUF server's reply past a limit of ``[publish.limits]``; its message is the one line
    naming the URL and the limit."""


class BoundedFetcher(FetcherInterface):
    """python-tuf's downloads through release/util/http.py: each request within
    ``limits.deadline_s``; metadata (under ``metadata_url``) at most ``limits.page_bytes``, a
    target at most ``limits.file_bytes`` (python-tuf's own lengths, smaller, apply as well)."""

    def __init__(self, metadata_url: str, limits: NetworkLimits) -> None:
        self._metadata_url = metadata_url
        self._limits = limits

    def _fetch(self, url: str) -> Iterator[bytes]:
        key: http.CapKey = "page_bytes" if url.startswith(self._metadata_url) else "file_bytes"
        return self._chunks(url, key)

    def _chunks(self, url: str, key: http.CapKey) -> Iterator[bytes]:
        # A generator: python-tuf wraps only what _fetch raises itself, so every error raised
        # while reading is a DownloadError here (DownloadHTTPError: a missing next root is 404).
        try:
            with http.opened(url, limits=self._limits, error=LimitError) as reply:
                yield from reply.chunks(key)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise DownloadHTTPError(f"{url}: HTTP {exc.code} {exc.reason}", exc.code) from None
        except urllib.error.URLError as exc:
            raise DownloadError(f"{url}: cannot be reached ({exc.reason})") from None


# python-tuf's messages where the metadata served do not match each other (not older than seen):
# the timestamp names another snapshot version, the snapshot another targets version, or a
# versioned root file holds another version (tuf/ngclient/_internal/trusted_metadata_set.py).
_MISMATCHES = (
    (re.compile(r"Expected snapshot version (\d+), got (\d+)"), "timestamp", "snapshot"),
    (re.compile(r"Expected (\w+) v(\d+), got v(\d+)\."), "snapshot", None),
    (re.compile(r"Expected root version (\d+) instead got version (\d+)"), None, "root"),
)


def mismatch(message: str) -> str | None:
    """What a BadVersionNumberError's ``message`` says in words when the metadata served do not
    match each other (mix-and-match); None when it is older than what was seen (rollback)."""
    for pattern, naming, named in _MISMATCHES:
        if found := pattern.search(message):
            *role, expected, served = found.groups()
            role_name = named or role[0]
            if naming is None:
                return f"the file of root version {expected} holds root version {served}"
            return (f"the {naming} names {role_name} version {expected} but the server serves "
                    f"{role_name} version {served}")  # fmt: skip
    return None


class TrustedIndex:
    """The TUF targets of an index, checked from a trusted root; ``refresh`` before use."""

    def __init__(
        self,
        tuf_url: str,
        trusted_root: Path,
        cache_dir: Path | None = None,
        *,
        limits: NetworkLimits = NetworkLimits(),  # noqa: B008
    ) -> None:
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
                fetcher=BoundedFetcher(self.metadata_url, limits),
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
            if mixed := mismatch(str(exc)):
                raise VerifyError(
                    f"TUF metadata from {self.metadata_url} do not match each other: {mixed} "
                    "(mix-and-match refused: metadata of different versions served together)"
                ) from None
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
        except LimitError as exc:
            raise VerifyError(str(exc)) from None
        except DownloadError as exc:
            raise VerifyError(
                f"TUF metadata cannot be downloaded from {self.metadata_url} ({_why(exc)})"
            ) from None

    def has_target(self, target_path: str) -> bool:
        """Whether ``target_path`` is a TUF target (after ``refresh``)."""
        return self._updater.get_targetinfo(target_path) is not None

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
        except LimitError as exc:
            raise VerifyError(str(exc)) from None
        except DownloadError as exc:
            raise VerifyError(
                f"{target_path} cannot be downloaded from {self.targets_url} ({_why(exc)})"
            ) from None
