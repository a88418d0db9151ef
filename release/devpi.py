"""A devpi-server index on 127.0.0.1 for the publisher: a second real index beside pypiserver.

``DevpiIndex`` initialises a server directory (``devpi-init``, no PyPI mirror), runs
``devpi-server --offline-mode`` and creates a user and a non-volatile stage index through devpi's
HTTP API. A non-volatile index refuses to overwrite or delete a file (409), which the publisher
relies on besides its own check. It offers what :class:`release.publish.IndexTarget` needs (twine
uploads with HTTP basic authentication to the index URL; listing from ``+simple/``).
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from release.errors import PackageIndexError
from release.index import answers, free_port

_HOST = "127.0.0.1"
_STOP_TIMEOUT_S = 15.0
_HTTP_TIMEOUT_S = 30.0
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 20


class _ExitedEarly(Exception):
    """devpi-server ended before it answered (e.g. its port was taken meanwhile)."""


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
        self._password = secrets.token_urlsafe(24)
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None

    @property
    def log_path(self) -> Path:
        return self._dir.with_name(self._dir.name + ".log")

    @property
    def base_url(self) -> str:
        if self._port is None:
            raise PackageIndexError("the devpi index is not running (use it as `with` block)")
        return f"http://{_HOST}:{self._port}"

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
    def password(self) -> str:
        return self._password

    def __enter__(self) -> DevpiIndex:
        self._initialise()
        for attempt in range(_PORT_ATTEMPTS):
            try:
                self._start()
                break
            except _ExitedEarly:
                self._stop()
                if attempt == _PORT_ATTEMPTS - 1:
                    raise PackageIndexError(
                        f"devpi-server exited before serving, {_PORT_ATTEMPTS} times (a port "
                        f"taken?); tail of {self.log_path}:\n{self._log_tail()}"
                    ) from None
            except BaseException:
                self._stop()
                raise
        try:
            self._create_user_and_index()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

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
        if (self._dir / ".serverversion").exists():
            return
        command = [self._tool("devpi-init"), "--serverdir", str(self._dir), "--no-root-pypi",
                   "--root-passwd", secrets.token_urlsafe(24)]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PackageIndexError(
                f"devpi-init --serverdir {self._dir} failed with status {result.returncode}:\n"
                f"{result.stderr[-2000:]}"
            )

    def _start(self) -> None:
        port = free_port()
        command = [self._tool("devpi-server"), "--serverdir", str(self._dir), "--host", _HOST,
                   "--port", str(port), "--offline-mode"]  # fmt: skip
        self._log = self.log_path.open("ab")
        self._log.write(f"--- starting devpi-server on {_HOST}:{port}\n".encode())
        self._log.flush()
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )
        self._port = port
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise _ExitedEarly()
            if answers(f"{self.base_url}/+api"):
                return
            time.sleep(0.2)
        raise PackageIndexError(
            f"devpi-server did not answer on {self.base_url} within "
            f"{self._startup_timeout:.0f} s; tail of {self.log_path}:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-_LOG_TAIL_LINES:])

    def _create_user_and_index(self) -> None:
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
            raise PackageIndexError(
                f"devpi: PUT {path} answered HTTP {exc.code} {exc.reason}"
            ) from None

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        self._port = None
