"""A devpi-server index on 127.0.0.1 for the publisher: a second real index beside pypiserver.

``DevpiIndex`` initialises a server directory (``devpi-init``, no PyPI mirror), runs
``devpi-server --offline-mode`` and creates a user and a non-volatile stage index through devpi's
HTTP API. A non-volatile index refuses to overwrite or delete a file (409), which the publisher
relies on besides its own check. It offers what :class:`release.trust.publish.IndexTarget` needs
(twine
uploads with HTTP basic authentication to the index URL; listing from ``+simple/``). A server
directory is reopened as it was left, with the password kept beside it (mode 0600).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from release.errors import PackageIndexError
from release.trust.server_process import HOST, ServerProcess

_HTTP_TIMEOUT_S = 30.0


class DevpiIndex:
    """A devpi-server subprocess with one user and one non-volatile index; a context manager."""

    def __init__(
        self,
        server_dir: Path,
        *,
        username: str = "activekv-publisher",
        index: str = "release",
        startup_timeout: float = 60.0,
    ) -> None:
        self._dir = server_dir
        self._username = username
        self._index = index
        self._password: str | None = None
        self._server = ServerProcess("devpi-server", self.log_path, startup_timeout=startup_timeout)

    @property
    def log_path(self) -> Path:
        return self._dir.with_name(self._dir.name + ".log")

    @property
    def base_url(self) -> str:
        port = self._server.port
        if port is None:
            raise PackageIndexError("the devpi index is not running (use it as `with` block)")
        return f"http://{HOST}:{port}"

    @property
    def url(self) -> str:
        """Where twine uploads to."""
        return f"{self.base_url}/{self._username}/{self._index}/"

    @property
    def simple_url(self) -> str:
        return f"{self.url}+simple/"

    @property
    def username(self) -> str:
        return self._username

    @property
    def password_path(self) -> Path:
        """The publisher's password, made with the server directory and kept beside it."""
        return self._dir.with_name(self._dir.name + ".password")

    @property
    def password(self) -> str:
        if self._password is None:
            raise PackageIndexError("the devpi index is not open (use it as `with` block)")
        return self._password

    def __enter__(self) -> DevpiIndex:
        self._initialise()
        self._server.start(self._command, lambda port: f"http://{HOST}:{port}/+api")
        try:
            self._create_user_and_index()
        except BaseException:
            self._server.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stop()

    def _tool(self, name: str) -> str:
        tool = Path(sys.executable).with_name(name)
        if tool.exists():
            return str(tool)
        found = shutil.which(name)
        if found is None:
            raise PackageIndexError(
                f"{name} is not installed next to {sys.executable} nor on PATH (pin "
                "devpi-server in the dependency group that runs this)"
            )
        return found

    def _initialise(self) -> None:
        """Make the server directory and the password on first use; read the password."""
        if not (self._dir / ".serverversion").exists():
            self._init_server_dir()
        try:
            self._password = self.password_path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise PackageIndexError(
                f"{self.password_path}: cannot read the publisher's password of {self._dir} "
                f"({exc.strerror}); expected the server directory to be made by DevpiIndex"
            ) from None

    def _init_server_dir(self) -> None:
        command = [self._tool("devpi-init"), "--serverdir", str(self._dir), "--no-root-pypi",
                   "--root-passwd", secrets.token_urlsafe(24)]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PackageIndexError(
                f"devpi-init --serverdir {self._dir} failed with status {result.returncode}:\n"
                f"{result.stderr[-2000:]}"
            )
        fd = os.open(self.password_path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        os.fchmod(fd, 0o600)  # whatever the umask, and a file left by an earlier attempt
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(secrets.token_urlsafe(24) + "\n")

    def _command(self, port: int) -> list[str]:
        return [self._tool("devpi-server"), "--serverdir", str(self._dir), "--host", HOST,
                "--port", str(port), "--offline-mode"]  # fmt: skip

    def _create_user_and_index(self) -> None:
        # A reopened server directory has both already (409): its files stay as they are.
        self._put(f"/{self._username}", {"password": self._password}, auth=False)
        self._put(
            f"/{self._username}/{self._index}",
            {"type": "stage", "bases": [], "volatile": False},
            auth=True,
        )

    def _put(self, path: str, document: dict[str, object], *, auth: bool) -> None:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(document).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json"},
            method="PUT",
        )
        if auth:
            token = base64.b64encode(f"{self._username}:{self._password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S):
                return
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                return
            raise PackageIndexError(
                f"devpi: PUT {path} answered HTTP {exc.code} {exc.reason}"
            ) from None
