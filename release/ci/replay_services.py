"""The services the self-hosted release runner keeps for the release job, run here for a replay
as their operators run them, each its own process (as tests/index_servers.py does):

* devpi-server at the URL ``[ci.release].index`` names (127.0.0.1:3141, ``/<user>/<index>/``):
  a server folder made once by ``devpi-init``, kept in the runner's folder between replays as
  an operator's index keeps its releases; the user and the index made with the devpi client,
  the user's credentials being the secrets file's ``ACTIVEKV_INDEX_USERNAME`` and
  ``ACTIVEKV_INDEX_PASSWORD`` (when the user is another than the URL's, the URL's owns the index
  and the secrets' user may upload to it);
* the TUF folder (``ACTIVEKV_TUF_DIR``) served as it lies by ``python -m http.server`` at
  ``[ci.release].tuf_url``.

Both are stopped when the replay ends, however it ends (they also die with it: see
release/trust/server_process.py).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from release.ci.replay_context import StandInError
from release.trust.credential_names import ENV_PASSWORD, ENV_TOKEN, ENV_USERNAME
from release.trust.server_process import HOST, ServerProcess

_STARTUP_S = 90.0


@dataclass(frozen=True)
class IndexPlace:
    """Where [ci.release] puts the index and the TUF folder's web server."""

    port: int
    owner: str
    index: str
    tuf_port: int


def index_place(index_url: str, tuf_url: str) -> IndexPlace:
    """The devpi user/index and the two ports of ``index_url`` and ``tuf_url`` (both on
    127.0.0.1: a replay serves them here)."""
    index, tuf = urlsplit(index_url), urlsplit(tuf_url)
    parts = [p for p in index.path.split("/") if p]
    if parts and parts[-1] in ("+simple", "simple"):
        parts = parts[:-1]
    for name, url in (("ci.release.index", index), ("ci.release.tuf_url", tuf)):
        if url.hostname != HOST or url.port is None:
            raise StandInError(
                f"{name}: expected an http URL of {HOST} with its port, which "
                f"the replay serves; got {url.geturl()}"
            )
    if len(parts) != 2:
        raise StandInError(
            f"ci.release.index: expected devpi's /<user>/<index>/+simple/; got {index_url}"
        )
    assert index.port is not None and tuf.port is not None
    return IndexPlace(index.port, parts[0], parts[1], tuf.port)


def _tool(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise StandInError(
            f"{name}: not installed (the test dependency group pins devpi-server and devpi-client)"
        )
    return found


class ReleaseServices:
    """devpi-server and the TUF folder's web server, for as long as the ``with`` lasts."""

    def __init__(
        self, place: IndexPlace, runner_dir: Path, tuf_dir: Path, secrets_given: Mapping[str, str]
    ) -> None:
        if secrets_given.get(ENV_TOKEN):
            raise StandInError(
                f"--secrets: {ENV_TOKEN}: the devpi-server of the replay takes "
                f"{ENV_USERNAME} and {ENV_PASSWORD}, not a token"
            )
        username, password = secrets_given.get(ENV_USERNAME), secrets_given.get(ENV_PASSWORD)
        if not username or not password:
            missing = ENV_USERNAME if not username else ENV_PASSWORD
            raise StandInError(
                f"--secrets: {missing}: expected the index user's credentials "
                "(the release job publishes with them); got nothing"
            )
        self.place, self.username, self.password = place, username, password
        self.server_dir = runner_dir / "devpi"
        self.client_dir = runner_dir / "devpi.client"
        self.tuf_dir = tuf_dir
        self._stack = ExitStack()
        self._devpi = ServerProcess(
            "devpi-server", runner_dir / "devpi.log", startup_timeout=_STARTUP_S
        )
        self._web = ServerProcess(
            "the TUF folder's web server", runner_dir / "tuf-web.log", startup_timeout=_STARTUP_S
        )

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.place.port}"

    def __enter__(self) -> ReleaseServices:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        if not (self.server_dir / ".serverversion").exists():
            shutil.rmtree(self.server_dir, ignore_errors=True)
            subprocess.run(
                [
                    _tool("devpi-init"),
                    "--serverdir",
                    str(self.server_dir),
                    "--no-root-pypi",
                    f"--root-passwd={secrets.token_urlsafe(16)}",
                ],
                check=True,
                capture_output=True,
            )
        port = self.place.port
        self._devpi.start_on(
            port,
            [
                _tool("devpi-server"),
                "--serverdir",
                str(self.server_dir),
                "--host",
                HOST,
                "--port",
                str(port),
                "--offline-mode",
            ],
            f"{self.base_url}/+api",
            advice="stop what listens there, or replay elsewhere",
        )
        self._stack.callback(self._devpi.stop)
        self._user_and_index()
        self.tuf_dir.mkdir(parents=True, exist_ok=True)
        tuf = self.place.tuf_port
        self._web.start_on(
            tuf,
            [
                sys.executable,
                "-m",
                "http.server",
                "--bind",
                HOST,
                "--directory",
                str(self.tuf_dir),
                str(tuf),
            ],
            f"http://{HOST}:{tuf}/",
            advice="stop what listens there, or replay elsewhere",
        )
        self._stack.callback(self._web.stop)

    def _client(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.client_dir),
            "DEVPI_CLIENTDIR": str(self.client_dir),
        }
        done = subprocess.run([_tool("devpi"), *args], env=env, capture_output=True, text=True)
        if check and done.returncode != 0:
            # devpi's words, never the command line: it holds the password.
            said = " ".join((done.stdout + done.stderr).split()).replace(self.password, "***")
            raise StandInError(f"devpi {args[0]}: {said[-400:]}")
        return done

    def _user_and_index(self) -> None:
        """The user and the index, made the first time (kept with the server's folder)."""
        place = self.place
        self._client("use", self.base_url)
        users = {place.owner: self.password, self.username: self.password}
        for user, password in users.items():
            if self._client("getjson", f"/{user}", check=False).returncode != 0:
                self._client("user", "-c", user, f"password={password}")
        self._client("login", place.owner, f"--password={self.password}")
        if self._client("getjson", f"/{place.owner}/{place.index}", check=False).returncode != 0:
            acl = ",".join(sorted({place.owner, self.username}))
            self._client(
                "index", "-c", place.index, "bases=", "volatile=False", f"acl_upload={acl}"
            )
        self._client("logoff")

    def describe(self) -> str:
        place = self.place
        return (
            f"devpi-server {self.base_url}/{place.owner}/{place.index}/ (folder "
            f"{self.server_dir}, user {self.username}) and the TUF folder {self.tuf_dir} "
            f"served at http://{HOST}:{place.tuf_port}/"
        )
