"""Package index servers as their operators run them, each its own process on 127.0.0.1, for the
tests that publish to a remote index (tests/test_remote_index.py):

* devpi-server: a persistent server directory made by ``devpi-init``, the server started with
  ``devpi-server``, a user and an index made with the devpi client (``devpi user``, ``devpi
  index``);
* pypiserver standalone (``pypi-server run``) with an htpasswd file;
* a static web server (``python -m http.server``) for the TUF folder served beside them.

Each keeps its port across restarts, so a restarted index has the URL it had.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # passlib 1.7.4 imports `crypt`
    from passlib.apache import HtpasswdFile

from release.trust.server_process import HOST, answers, free_port


def _tool(name: str) -> str:
    """A console script of this interpreter's environment (the test group installs them)."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed (the test dependency group pins it)"
    return found


class Server:
    """One server process on a fixed port, restartable; its output goes to ``<folder>.log``."""

    def __init__(self, folder: Path, ready_path: str) -> None:
        self.folder = folder
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self._ready_path = ready_path
        self._process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        log = self.folder.with_name(self.folder.name + ".log").open("ab")
        self._process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        deadline = time.monotonic() + 90
        while not answers(self.base_url + self._ready_path):
            assert self._process.poll() is None, f"{self.command()[0]} exited; see its log"
            assert time.monotonic() < deadline, f"{self.command()[0]} did not start"
            time.sleep(0.2)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(30)
        self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DevpiServer(Server):
    """devpi-server with a user and a stage index (``volatile`` as given) made by the client."""

    def __init__(self, folder: Path, *, volatile: bool = False) -> None:
        super().__init__(folder, "/+api")
        self.username, self.password = "release-bot", secrets.token_urlsafe(16)
        self.volatile = volatile
        self.client_dir = folder.with_name(folder.name + ".client")
        subprocess.run([_tool("devpi-init"), "--serverdir", str(folder), "--no-root-pypi",
                        f"--root-passwd={secrets.token_urlsafe(16)}"],
                       check=True, capture_output=True)  # fmt: skip

    def command(self) -> list[str]:
        return [_tool("devpi-server"), "--serverdir", str(self.folder), "--host", HOST,
                "--port", str(self.port), "--offline-mode"]  # fmt: skip

    def start(self) -> None:
        super().start()
        if not (self.client_dir / "created").exists():
            self._client("use", self.base_url)
            self._client("user", "-c", self.username, f"password={self.password}")
            self._client("login", self.username, f"--password={self.password}")
            self._client("index", "-c", "releases", f"volatile={self.volatile}", "bases=")
            (self.client_dir / "created").touch()

    def _client(self, *args: str) -> None:
        env = {**os.environ, "DEVPI_CLIENTDIR": str(self.client_dir)}
        subprocess.run([_tool("devpi"), *args], env=env, check=True, capture_output=True)

    @property
    def upload_url(self) -> str:
        return f"{self.base_url}/{self.username}/releases/"

    @property
    def simple_url(self) -> str:
        return self.upload_url + "+simple/"


class PypiServer(Server):
    """pypiserver standalone: uploads need the htpasswd user; ``--overwrite`` as given."""

    def __init__(self, folder: Path, *, overwrite: bool = False, token: str | None = None) -> None:
        super().__init__(folder, "/simple/")
        self.username, self.password = "release-bot", secrets.token_urlsafe(16)
        self.overwrite = overwrite
        folder.mkdir(parents=True)
        self.htpasswd = folder.with_name(folder.name + ".htpasswd")
        passwords = HtpasswdFile(str(self.htpasswd), new=True)
        passwords.set_password(self.username, self.password)
        if token is not None:  # an API token, as twine sends it: user __token__
            passwords.set_password("__token__", token)
        passwords.save()

    def command(self) -> list[str]:
        return [_tool("pypi-server"), "run", "--host", HOST, "--port", str(self.port),
                "--passwords", str(self.htpasswd), "--authenticate", "update",
                "--disable-fallback", "--hash-algo", "sha256",
                *(["--overwrite"] if self.overwrite else []), str(self.folder)]  # fmt: skip

    @property
    def upload_url(self) -> str:
        return self.base_url + "/"

    @property
    def simple_url(self) -> str:
        return self.base_url + "/simple/"


class StaticServer(Server):
    """A folder served as it lies, as any static web server serves it."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder, "/")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "http.server", "--bind", HOST, "--directory",
                str(self.folder), str(self.port)]  # fmt: skip

    @property
    def url(self) -> str:
        return self.base_url + "/"
