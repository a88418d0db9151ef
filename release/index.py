"""The embedded private package index: a pypiserver on 127.0.0.1 with htpasswd authentication,
its packages, credentials and TUF repository kept under ``<state_dir>/index/`` between runs.
The server process is :mod:`release.index_server`, which also serves the TUF metadata and the
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
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from html.parser import HTMLParser
from pathlib import Path
from types import TracebackType
from typing import IO

from release.errors import PackageIndexError

with warnings.catch_warnings():
    # passlib 1.7.4 imports the stdlib `crypt` module, deprecated since Python 3.11.
    warnings.simplefilter("ignore", DeprecationWarning)
    from passlib.apache import HtpasswdFile

_HOST = "127.0.0.1"
_STOP_TIMEOUT_S = 10.0
_HTTP_TIMEOUT_S = 30.0
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 30


class EmbeddedIndex:
    """A pypiserver subprocess serving ``<state_dir>/index/packages``; a context manager.

    On first use the state directory gets ``index/packages/``, ``index/htpasswd`` and
    ``index/credentials.json`` (mode 0600, a generated password); later uses reuse them.
    """

    def __init__(self, state_dir: Path, username: str, *, startup_timeout: float = 30.0) -> None:
        self._dir = state_dir / "index"
        self._username = username
        self._startup_timeout = startup_timeout
        self._password: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None
        self._process_status: int | None = None

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
        if self._port is None:
            raise PackageIndexError("the embedded index is not running (use it as `with` block)")
        return f"http://{_HOST}:{self._port}"

    @property
    def simple_url(self) -> str:
        return f"{self.url}/simple/"

    @property
    def tuf_url(self) -> str:
        """The TUF repository: ``metadata/`` and ``targets/provenance/`` below it."""
        return f"{self.url}/tuf/"

    def __enter__(self) -> EmbeddedIndex:
        self._password = self._ensure_state()
        last_error: PackageIndexError | None = None
        for _ in range(_PORT_ATTEMPTS):
            try:
                self._start(free_port())
                return self
            except _PortTaken as exc:
                last_error = PackageIndexError(str(exc))
        assert last_error is not None
        raise last_error

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _start(self, port: int) -> None:
        command = [
            sys.executable,
            # By path: the server needs only pypiserver, wherever this package is importable.
            str(Path(__file__).with_name("index_server.py")),
            "--tuf-metadata",
            str(self.tuf_dir / "metadata"),
            "--provenance",
            str(self.provenance_dir),
            "--",
            "run",
            "-v",
            "--host",
            _HOST,
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
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log = self.log_path.open("ab")
        self._log.write(f"--- starting pypiserver on {_HOST}:{port}\n".encode())
        self._log.flush()
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )
        self._port = port
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = self._log_tail(log_start)
                self._stop()
                if "Address already in use" in tail:
                    raise _PortTaken(f"port {port} was taken:\n{tail}")
                raise PackageIndexError(
                    f"pypiserver exited with status {self._process_status} before serving; "
                    f"tail of {self.log_path}:\n{tail}"
                )
            if answers(self.simple_url):
                return
            time.sleep(0.1)
        tail = self._log_tail(log_start)
        self._stop()
        raise PackageIndexError(
            f"pypiserver did not answer on http://{_HOST}:{port}/simple/ within "
            f"{self._startup_timeout:.0f} s; tail of {self.log_path}:\n{tail}"
        )

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            self._process_status = process.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        self._port = None

    def _log_tail(self, start: int) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            with self.log_path.open("rb") as stream:
                stream.seek(start)
                text = stream.read().decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])


class _PortTaken(Exception):
    pass


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (a server may still race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    """Whether `url` answers 200 within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# ------------------------------------------------------------------------------- listing


def normalize_project(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def list_project_files(simple_url: str, project: str) -> dict[str, str]:
    """File name to sha256 of every file the index serves for ``project``; {} when unknown.

    Digests come from the links' ``#sha256=`` fragments (pypiserver computes them from the stored
    files); a link without one is downloaded and hashed.
    """
    page_url = urllib.parse.urljoin(simple_url.rstrip("/") + "/", f"{normalize_project(project)}/")
    try:
        with urllib.request.urlopen(page_url, timeout=_HTTP_TIMEOUT_S) as response:
            page_base = response.geturl()
            html = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        raise PackageIndexError(f"{page_url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PackageIndexError(f"{page_url}: the index cannot be reached ({exc})") from None
    files: dict[str, str] = {}
    for href in _links(html):
        absolute = urllib.parse.urljoin(page_base, href)
        location, _, fragment = absolute.partition("#")
        filename = urllib.parse.unquote(location.rsplit("/", 1)[-1])
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
