"""The embedded private package index: a pypiserver on 127.0.0.1 with htpasswd authentication,
its packages, credentials and TUF repository kept under ``<state_dir>/index/`` between runs.
The server process is :mod:`release.scripts.index_server`, which also serves the TUF metadata and
the
signed statements at ``<url>/tuf/``.

pypiserver is started without ``--overwrite`` (an existing file is never replaced: re-upload is
refused with 409, 400 to twine) and with ``--disable-fallback`` (an unknown project is a 404, never
a redirect to pypi.org). Listing and downloading need no credentials; uploading does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import secrets
import stat
import sys
import urllib.error
import urllib.parse
import warnings
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from types import TracebackType

from pypi_simple import ProjectPage, RepositoryPage, UnsupportedRepoVersionError

from release.errors import PackageIndexError
from release.manifest import NetworkLimits
from release.trust.release_version import normalize_project
from release.trust.server_process import HOST, ServerProcess
from release.util import http
from release.util.paths import script

with warnings.catch_warnings():
    # passlib 1.7.4 imports the stdlib `crypt` module, deprecated since Python 3.11.
    warnings.simplefilter("ignore", DeprecationWarning)
    from passlib.apache import HtpasswdFile


class EmbeddedIndex:
    """A pypiserver subprocess serving ``<state_dir>/index/packages``; a context manager.

    On first use the state directory gets ``index/packages/``, ``index/htpasswd`` and
    ``index/credentials.json`` (mode 0600, a generated password); later uses reuse them.
    """

    def __init__(
        self, state_dir: Path, username: str, *, startup_timeout: float = 30.0, port: int = 0
    ) -> None:
        if not 0 <= port <= _MAX_PORT:
            raise PackageIndexError(f"port: expected 0 (any free port) to {_MAX_PORT}; got {port}")
        self._dir = state_dir / "index"
        self._username = username
        self._port = port  # 0: a free port, another each time it is served
        self._password: str | None = None
        self._server = ServerProcess("pypiserver", self.log_path, startup_timeout=startup_timeout)

    # -- state ---------------------------------------------------------------------------

    @property
    def packages_dir(self) -> Path:
        return self._dir / "packages"

    @property
    def htpasswd_path(self) -> Path:
        return self._dir / "htpasswd"

    @property
    def credentials_path(self) -> Path:
        return self._dir / "credentials.json"

    @property
    def log_path(self) -> Path:
        return self._dir / "server.log"

    @property
    def tuf_dir(self) -> Path:
        """The publisher's TUF repository (keys and metadata); only ``metadata/`` is served."""
        return self._dir / "tuf"

    @property
    def keys_dir(self) -> Path:
        """The TUF roles' generated (dev) keys, beside the metadata and never served."""
        return self.tuf_dir / "keys"

    @property
    def provenance_dir(self) -> Path:
        """The signed statements, one per version; served as TUF targets ``provenance/…``."""
        return self._dir / "metadata"

    @property
    def username(self) -> str:
        return self._username

    @property
    def password(self) -> str:
        if self._password is None:
            self._password = self._ensure_state()
        return self._password

    def _ensure_state(self) -> str:
        """Create the index's directories and credentials on first use; return the password."""
        self.packages_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self._dir, 0o700)
        (self.tuf_dir / "metadata").mkdir(parents=True, exist_ok=True)
        self.provenance_dir.mkdir(parents=True, exist_ok=True)
        password = self._load_or_create_credentials()
        if not self.htpasswd_path.exists():
            os.close(os.open(self.htpasswd_path, os.O_CREAT | os.O_WRONLY, 0o600))
        mode = stat.S_IMODE(self.htpasswd_path.stat().st_mode)
        if mode & 0o077:
            raise PackageIndexError(
                f"{self.htpasswd_path} has mode {mode:04o}; the index's password file must be "
                f"readable and writable by its owner only (chmod 600 {self.htpasswd_path})"
            )
        htpasswd = HtpasswdFile(str(self.htpasswd_path))
        if not htpasswd.check_password(self._username, password):
            htpasswd.set_password(self._username, password)
            htpasswd.save()
        return password

    def _load_or_create_credentials(self) -> str:
        path = self.credentials_path
        if not path.exists():
            password = secrets.token_urlsafe(32)
            document = json.dumps({"username": self._username, "password": password}, indent=2)
            with contextlib.suppress(FileExistsError):
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                os.fchmod(fd, 0o600)  # whatever the umask
                with os.fdopen(fd, "w", encoding="utf-8") as stream:
                    stream.write(document + "\n")
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise PackageIndexError(
                f"{path} has mode {mode:04o}; credentials must be readable by their owner only "
                f"(chmod 600 {path})"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            stored_user, password = data["username"], data["password"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PackageIndexError(
                f"{path}: not a credentials file ({type(exc).__name__})"
            ) from None
        if stored_user != self._username:
            raise PackageIndexError(
                f"{path} holds credentials for user {stored_user!r}, not {self._username!r} "
                "(the manifest's [publish].username changed?)"
            )
        if not isinstance(password, str) or not password:
            raise PackageIndexError(f"{path}: the password is empty")
        return password

    # -- server --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        port = self._server.port
        if port is None:
            raise PackageIndexError("the embedded index is not running (use it as `with` block)")
        return f"http://{HOST}:{port}"

    @property
    def simple_url(self) -> str:
        return f"{self.url}/simple/"

    def overwrite_note(self) -> str | None:
        return None  # pypiserver runs without --overwrite: it refuses a second upload itself

    @property
    def tuf_url(self) -> str:
        """The TUF repository: ``metadata/`` and ``targets/provenance/`` below it."""
        return f"{self.url}/tuf/"

    @property
    def fixed_port(self) -> bool:
        """Whether it serves on the port it was given, so at the same URL each time."""
        return self._port != 0

    def __enter__(self) -> EmbeddedIndex:
        self._password = self._ensure_state()
        if self._port == 0:
            self._server.start(self._command, _ready_url)
        else:  # this port or none: another would not be the URL a consumer was given
            self._server.start_on(self._port, self._command(self._port), _ready_url(self._port),
                                  advice="give --port another, or 0 for any free one")  # fmt: skip
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stop()

    def _command(self, port: int) -> list[str]:
        return [
            sys.executable,
            # By path: the server needs only pypiserver, wherever this package is importable.
            str(script("index_server")),
            "--tuf-metadata",
            str(self.tuf_dir / "metadata"),
            "--provenance",
            str(self.provenance_dir),
            "--",
            "run",
            "-v",
            "--host",
            HOST,
            "--port",
            str(port),
            "--passwords",
            str(self.htpasswd_path),
            "--authenticate",
            "update",
            "--disable-fallback",
            "--hash-algo",
            "sha256",
            "--server",
            "wsgiref",
            str(self.packages_dir),
        ]


_MAX_PORT = 65535


def _ready_url(port: int) -> str:
    return f"http://{HOST}:{port}/simple/"


# ------------------------------------------------------------------------------- listing

# What pip asks an index page for (pip/_internal/index/collector.py): PEP 691 JSON first.
SIMPLE_ACCEPT = ", ".join(
    ["application/vnd.pypi.simple.v1+json", "application/vnd.pypi.simple.v1+html; q=0.1",
     "text/html; q=0.01"]
)  # fmt: skip
_JSON_PAGE = "application/vnd.pypi.simple.v1+json"
_HTML_PAGES = ("text/html", "application/vnd.pypi.simple.v1+html")
# pip's egg= name-version, which it takes over the file name (pip/_internal/models/link.py),
# read anywhere in the URL, and only when it is a project name.
_EGG = re.compile(r"[#&]egg=([^&]*)")
_EGG_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_RESERVED = re.compile(r"(@|%2F)", re.IGNORECASE)


@dataclass(frozen=True)
class IndexFile:
    """One link of a project's index page, as pip reads it."""

    filename: str  # pip's: the URL path's last segment, unquoted (no query, no fragment)
    url: str  # what pip downloads: the link quoted as pip quotes it, without its fragment
    sha256: str | None  # from the link's #sha256= or the JSON page's hashes
    egg: str | None = None  # an egg= name-version, which pip reads the version from


def project_page_url(simple_url: str, project: str) -> str:
    return urllib.parse.urljoin(simple_url.rstrip("/") + "/", f"{normalize_project(project)}/")


def project_files(
    simple_url: str,
    project: str,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
) -> list[IndexFile]:
    """Every link of the project's page of the index (PEP 503 HTML or PEP 691 JSON, asked for as
    pip asks), read with pypi-simple; [] when the index does not know the project;
    PackageIndexError when the page cannot be read, is too large or too slow (``limits``)."""
    page_url = project_page_url(simple_url, project)
    try:
        reply, body = http.get(page_url, limits=limits, headers={"Accept": SIMPLE_ACCEPT})
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            return []
        raise PackageIndexError(f"{page_url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise PackageIndexError(f"{page_url}: the index cannot be reached ({exc.reason})") from None
    return parse_project_page(reply.url, reply.headers, body)


def parse_project_page(page_url: str, headers: Message, body: bytes) -> list[IndexFile]:
    """The links of a project page served with ``headers`` (pip reads no other kind)."""
    content_type = headers.get("Content-Type") and headers.get_content_type()
    try:
        if content_type == _JSON_PAGE:
            page = ProjectPage.from_json_data(json.loads(body), base_url=page_url)
            return [_index_file(p.url, p.digests.get("sha256")) for p in page.packages]
        if content_type in _HTML_PAGES:
            charset = headers.get_content_charset()
            links = RepositoryPage.from_html(body, page_url, charset).links
            return [_index_file(link.url, None) for link in links]
    except (ValueError, UnsupportedRepoVersionError) as exc:
        raise PackageIndexError(f"{page_url}: not a PEP 503/691 project page "
                                f"({type(exc).__name__})") from None  # fmt: skip
    raise PackageIndexError(
        f"{page_url}: expected a PEP 503 (text/html) or PEP 691 ({_JSON_PAGE}) project page; "
        f"got Content-Type {headers.get('Content-Type', 'none')!r}"
    )


def _index_file(url: str, listed_sha256: str | None) -> IndexFile:
    location, _, fragment = url.partition("#")
    hashes = urllib.parse.parse_qs(fragment)
    egg = _EGG.search(url)
    return IndexFile(
        filename=pip_filename(url),
        url=_pip_quoted(location),
        sha256=(hashes["sha256"][0] if "sha256" in hashes else listed_sha256 or None),
        egg=egg.group(1) if egg and _EGG_NAME.match(egg.group(1)) else None,
    )


def pip_filename(url: str) -> str:
    """The name pip gives the file at ``url`` (its Link.filename): the path's last segment,
    percent-decoded (a %2F in it splits it), without query or fragment; "" for none."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    name = posixpath.basename(path.rstrip("/"))
    return "" if name in (".", "..") else name


def _pip_quoted(url: str) -> str:
    """``url`` quoted as pip quotes a link before it downloads it (its _ensure_quoted_url)."""
    parts = urllib.parse.urlsplit(url)
    pieces = _RESERVED.split(parts.path)
    path = "".join(urllib.parse.quote(urllib.parse.unquote(piece)) if number % 2 == 0
                   else piece.upper() for number, piece in enumerate(pieces))  # fmt: skip
    return urllib.parse.urlunsplit(parts._replace(path=path))


def list_project_files(
    simple_url: str,
    project: str,
    *,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
) -> dict[str, str]:
    """File name to sha256 of every file the index serves for ``project``; {} when unknown.

    Digests come from the links' ``#sha256=`` fragments or the JSON page's hashes (pypiserver
    computes them from the stored files); a file listed without one is downloaded and hashed.
    """
    files: dict[str, str] = {}
    for found in project_files(simple_url, project, limits=limits):
        files[found.filename] = (found.sha256 or _download_sha256(found.url, limits)).lower()
    return files


def _download_sha256(url: str, limits: NetworkLimits) -> str:
    digest = hashlib.sha256()
    try:
        http.fetch(url, digest.update, limits=limits)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise PackageIndexError(f"{url}: cannot download to compute its digest (HTTP "
                                f"{exc.code} {exc.reason})") from None  # fmt: skip
    except urllib.error.URLError as exc:
        raise PackageIndexError(
            f"{url}: cannot download to compute its digest ({exc.reason})"
        ) from None
    return digest.hexdigest()


def install_hint(simple_url: str, project: str, *, port_changes: bool = False) -> str:
    """How a consumer installs `project` from the index, with pip's own configuration off;
    ``port_changes``: the URL's port is another each time the index is served (says so)."""
    hint = f"install with: PIP_CONFIG_FILE=/dev/null pip install --index-url {simple_url} {project}"
    if port_changes:
        hint += " (this port is another each time the index is served; `serve --port N` keeps one)"
    return hint
