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
import re
import secrets
import stat
import sys
import urllib.error
import urllib.parse
import urllib.request
import warnings
from html.parser import HTMLParser
from pathlib import Path
from types import TracebackType

from release.errors import PackageIndexError
from release.trust.server_process import HOST, ServerProcess
from release.util.paths import script

with warnings.catch_warnings():
    # passlib 1.7.4 imports the stdlib `crypt` module, deprecated since Python 3.11.
    warnings.simplefilter("ignore", DeprecationWarning)
    from passlib.apache import HtpasswdFile

_HTTP_TIMEOUT_S = 30.0


class EmbeddedIndex:
    """A pypiserver subprocess serving ``<state_dir>/index/packages``; a context manager.

    On first use the state directory gets ``index/packages/``, ``index/htpasswd`` and
    ``index/credentials.json`` (mode 0600, a generated password); later uses reuse them.
    """

    def __init__(self, state_dir: Path, username: str, *, startup_timeout: float = 30.0) -> None:
        self._dir = state_dir / "index"
        self._username = username
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

    def __enter__(self) -> EmbeddedIndex:
        self._password = self._ensure_state()
        self._server.start(self._command, lambda port: f"http://{HOST}:{port}/simple/")
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


# ------------------------------------------------------------------------------- listing


def normalize_project(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_links(simple_url: str, project: str) -> list[tuple[str, str, str]]:
    """(file name, download URL, fragment) of every link on the project's page of the index
    (none when the index does not know the project); PackageIndexError when it cannot be read."""
    page_url = urllib.parse.urljoin(simple_url.rstrip("/") + "/", f"{normalize_project(project)}/")
    try:
        with urllib.request.urlopen(page_url, timeout=_HTTP_TIMEOUT_S) as response:
            page_base = response.geturl()
            html = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise PackageIndexError(f"{page_url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PackageIndexError(f"{page_url}: the index cannot be reached ({exc})") from None
    links = []
    for href in _links(html):
        location, _, fragment = urllib.parse.urljoin(page_base, href).partition("#")
        links.append((urllib.parse.unquote(location.rsplit("/", 1)[-1]), location, fragment))
    return links


def list_project_files(simple_url: str, project: str) -> dict[str, str]:
    """File name to sha256 of every file the index serves for ``project``; {} when unknown.

    Digests come from the links' ``#sha256=`` fragments (pypiserver computes them from the stored
    files); a link without one is downloaded and hashed.
    """
    files: dict[str, str] = {}
    for filename, location, fragment in project_links(simple_url, project):
        algorithm, _, digest = fragment.partition("=")
        files[filename] = digest.lower() if algorithm == "sha256" else _download_sha256(location)
    return files


def _download_sha256(url: str) -> str:
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as response:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
    except (urllib.error.URLError, OSError) as exc:
        raise PackageIndexError(f"{url}: cannot download to compute its digest ({exc})") from None
    return digest.hexdigest()


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def _links(html: str) -> list[str]:
    parser = _AnchorParser()
    parser.feed(html)
    parser.close()
    return parser.hrefs


def install_hint(simple_url: str, project: str) -> str:
    """How a consumer installs `project` from the index, with pip's own configuration off."""
    return f"install with: PIP_CONFIG_FILE=/dev/null pip install --index-url {simple_url} {project}"
