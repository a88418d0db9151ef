"""Publishing to an index its operator already runs: devpi-server and pypiserver, each started as
its own process the way an operator runs it (tests/index_servers.py), the TUF folder served beside
it by a static web server. `python -m release publish --index URL` publishes there with
credentials from the environment; a restarted server is found as it was left; a consumer installs
with pip's own configuration off and verifies against the served TUF repository."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_sign import TAGS, gated_out, signed_out_dir
from index_servers import DevpiServer, PypiServer, StaticServer

from release.trust.index import list_project_files
from release.trust.publish import PAUSE_ENV
from release.trust.release_version import PROVENANCE_PREFIX
from release.trust.remote_index import ENV_PASSWORD, ENV_TOKEN, ENV_USERNAME
from release.trust.tuf_metadata import TufRepository
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.pins import project_version

pytestmark = pytest.mark.remote_index

VERSION = project_version()
SERVERS = {"devpi": DevpiServer, "pypiserver": PypiServer}


@pytest.fixture(params=sorted(SERVERS))
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DevpiServer | PypiServer]:
    with SERVERS[request.param](tmp_path / request.param) as running:
        yield running


@pytest.fixture
def tuf_server(tmp_path: Path) -> Iterator[StaticServer]:
    with StaticServer(tmp_path / "served-tuf") as running:
        yield running


def _target(server: DevpiServer | PypiServer, tuf: StaticServer) -> list[str]:
    """The options that point a publish at `server` (its upload URL by the server's convention)."""
    return ["--index", server.simple_url, "--tuf-dir", str(tuf.folder), "--tuf-url", tuf.url]


def _env(**credentials: str) -> dict[str, str]:
    """This environment without index credentials or twine settings, plus `credentials`; keyring
    answers nothing (a developer's keyring must not decide a test)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACTIVEKV_INDEX_", "TWINE_"))}  # fmt: skip
    return {**env, "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring", **credentials}


def _as(server: DevpiServer | PypiServer, password: str | None = None) -> dict[str, str]:
    return _env(**{ENV_USERNAME: server.username, ENV_PASSWORD: password or server.password})


def _release(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "release", *map(str, args)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip


def _publish(out: Path, state: Path, target: list[str], env: dict[str, str]):
    return _release("publish", "--out", out, "--state-dir", state, *target, env=env)


def _statements(tuf: StaticServer) -> list[Path]:
    return sorted((tuf.folder / "targets" / "provenance").glob("*.intoto.json"))


def test_publish_restart_publish_again_and_verify_as_a_consumer(
    server: DevpiServer | PypiServer, tuf_server: StaticServer, tmp_path: Path
) -> None:
    out, state, wheels = signed_out_dir(tmp_path / "release", VERSION)
    first = _publish(out, state, _target(server, tuf_server), _as(server))
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"uploaded {len(wheels)} file(s)" in first.stdout
    assert server.password not in first.stdout + first.stderr
    digests = {wheel.name: sha256_file(wheel) for wheel in wheels}
    assert list_project_files(server.simple_url, "activekv") == digests
    # The served folder holds metadata and statements, never the TUF roles' keys.
    assert not [p for p in tuf_server.folder.rglob("*") if p.suffix == ".pem"]
    assert (state / "remote-index" / "tuf-keys" / "root.pem").exists()

    server.restart()
    again = _publish(out, state, _target(server, tuf_server), _as(server))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already exists on the index; nothing uploaded" in again.stdout
    assert list_project_files(server.simple_url, "activekv") == digests

    key = next((out / "provenance").glob("*.pub.json"))
    consumer = _env(PIP_CONFIG_FILE="/dev/null")
    consumer.pop("PIP_FIND_LINKS", None)
    verified = _release(
        "verify", "--index", server.simple_url, "--tuf-url", tuf_server.url,
        "--root", tuf_server.folder / "metadata" / "1.root.json", "--provenance-key", key,
        "--tuf-cache", tmp_path / "consumer-cache", "--import", "activekv._probe",
        f"activekv=={VERSION}", "--out", tmp_path / "verify-out", env=consumer,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "matches its TUF target and the signed statement" in verified.stdout


def test_missing_credentials_are_refused_before_anything_is_stored(
    server: DevpiServer | PypiServer, tuf_server: StaticServer, tmp_path: Path
) -> None:
    out, state, _ = signed_out_dir(tmp_path / "release", VERSION)
    refused = _publish(out, state, _target(server, tuf_server), _env())
    assert refused.returncode == 2
    assert f"publishing to {server.upload_url} needs credentials" in refused.stderr
    assert ENV_PASSWORD in refused.stderr and ENV_TOKEN in refused.stderr
    assert list_project_files(server.simple_url, "activekv") == {}
    assert _statements(tuf_server) == []  # not even the version's intent


def test_wrong_credentials_are_refused_naming_the_variables(
    server: DevpiServer | PypiServer, tuf_server: StaticServer, tmp_path: Path
) -> None:
    out, state, _ = signed_out_dir(tmp_path / "release", VERSION)
    wrong = "not-" + server.password
    refused = _publish(out, state, _target(server, tuf_server), _as(server, wrong))
    assert refused.returncode == 2
    assert f"{server.upload_url} refused the credentials of user '{server.username}'" in (
        refused.stderr
    )
    assert ENV_USERNAME in refused.stderr and ENV_PASSWORD in refused.stderr
    assert wrong not in refused.stdout + refused.stderr
    assert list_project_files(server.simple_url, "activekv") == {}
    assert _statements(tuf_server) == []


def test_a_token_variable_publishes_as_the_token_user(
    tuf_server: StaticServer, tmp_path: Path
) -> None:
    with PypiServer(tmp_path / "pypiserver", token="pypi-test-token") as server:
        out, state, wheels = signed_out_dir(tmp_path / "release", VERSION)
        env = _env(**{ENV_TOKEN: "pypi-test-token"})
        published = _publish(out, state, _target(server, tuf_server), env)
        assert published.returncode == 0, published.stdout + published.stderr
        assert len(list_project_files(server.simple_url, "activekv")) == len(wheels)
        assert "pypi-test-token" not in published.stdout + published.stderr


@pytest.mark.parametrize("kind", ["devpi", "pypiserver"])
def test_a_server_that_would_overwrite_is_never_let_to(
    kind: str, tuf_server: StaticServer, tmp_path: Path
) -> None:
    """A volatile devpi index and pypiserver --overwrite replace a file of a name they have; the
    pipeline refuses a publish with other bytes under a published name all the same, and says
    where it can tell that the server would have let it."""
    make = {"devpi": lambda: DevpiServer(tmp_path / kind, volatile=True),
            "pypiserver": lambda: PypiServer(tmp_path / kind, overwrite=True)}  # fmt: skip
    with make[kind]() as server:
        out, state, wheels = signed_out_dir(tmp_path / "first", VERSION)
        published = _publish(out, state, _target(server, tuf_server), _as(server))
        assert published.returncode == 0, published.stdout + published.stderr
        listed = list_project_files(server.simple_url, "activekv")
        # Another publisher, with its own TUF folder: only the index's listing can stop it.
        other_out, other_state = tmp_path / "second" / "out", tmp_path / "second" / "state"
        gated_out(other_out, TAGS, VERSION, other_state, salt="other bytes")  # same names
        other = _release("sign", "--out", other_out, "--state-dir", other_state, env=_env())
        assert other.returncode == 0, other.stdout + other.stderr
        with StaticServer(tmp_path / "other-tuf") as other_tuf:
            refused = _publish(other_out, other_state, _target(server, other_tuf), _as(server))
        assert refused.returncode == 2
        assert "already has different bytes under the same file name" in refused.stderr
        if kind == "devpi":
            assert "the server would have let it" in refused.stderr
        assert list_project_files(server.simple_url, "activekv") == listed
        assert set(listed.values()) == {sha256_file(w) for w in wheels}


def _killed_after_first_upload(
    command: list[str], env: dict[str, str], server: PypiServer, scratch: Path
) -> str:
    """Runs a publish and kills it once the index lists its first upload; that file's name. Its
    temporary files go to `scratch` (a killed publish cannot remove its private copies)."""
    scratch.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(command, cwd=REPO_ROOT,
                               env={**env, PAUSE_ENV: "60", "TMPDIR": str(scratch)},
                               start_new_session=True, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (listed := list_project_files(server.simple_url, "activekv")):
            assert process.poll() is None, "the publish ended before it could be killed"
            assert time.monotonic() < deadline, "the first upload never reached the index"
            time.sleep(0.1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
    assert len(listed) == 1
    return next(iter(listed))


def test_a_killed_publish_is_completed_by_running_it_again(
    tuf_server: StaticServer, tmp_path: Path
) -> None:
    with PypiServer(tmp_path / "pypiserver") as server:
        out, state, wheels = signed_out_dir(tmp_path / "release", VERSION)
        target = _target(server, tuf_server)
        command = [sys.executable, "-m", "release", "publish", "--out", str(out),
                   "--state-dir", str(state), *target]  # fmt: skip
        first = _killed_after_first_upload(command, _as(server), server, tmp_path / "tmp")
        assert TufRepository(tuf_server.folder).targets() == {}  # nothing committed yet

        # The version's files were fixed when it started: another set is refused.
        other_out = tmp_path / "other" / "out"
        gated_out(other_out, TAGS[:2], VERSION, state)
        signed = _release("sign", "--out", other_out, "--state-dir", state, env=_env())
        assert signed.returncode == 0, signed.stdout + signed.stderr
        refused = _publish(other_out, state, target, _as(server))
        assert refused.returncode == 2
        assert "fixed by the first publish that started it" in refused.stderr

        resumed = _publish(out, state, target, _as(server))
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"already present, identical: {first}" in resumed.stdout
        digests = {wheel.name: sha256_file(wheel) for wheel in wheels}
        assert list_project_files(server.simple_url, "activekv") == digests
        targets = TufRepository(tuf_server.folder).targets()
        assert {name: targets[name].hashes["sha256"] for name in digests} == digests
        assert f"{PROVENANCE_PREFIX}activekv-{VERSION}.intoto.json" in targets


def test_the_manifest_names_the_remote_index_and_a_tuf_dir_beside_it(tmp_path: Path) -> None:
    """[publish] index, tuf_dir (relative: to the manifest's folder) and tuf_url, no options."""
    with PypiServer(tmp_path / "pypiserver") as server, StaticServer(tmp_path / "tuf") as tuf:
        manifest = tmp_path / "remote.toml"
        remote = f'index = "{server.simple_url}"\ntuf_dir = "tuf"\ntuf_url = "{tuf.url}"'
        text = DEFAULT_MANIFEST.read_text(encoding="utf-8")
        manifest.write_text(text.replace('index = "embedded"', remote), encoding="utf-8")
        out, state, wheels = signed_out_dir(tmp_path / "release", VERSION)
        published = _release("publish", "--manifest", manifest, "--out", out, "--state-dir",
                             state, env=_as(server))  # fmt: skip
        assert published.returncode == 0, published.stdout + published.stderr
        assert len(list_project_files(server.simple_url, "activekv")) == len(wheels)
        assert set(TufRepository(tuf.folder).targets()) >= {w.name for w in wheels}


def test_an_opened_index_never_shows_its_password(tmp_path: Path) -> None:
    from release.trust.remote_index import RemoteIndex

    index = RemoteIndex("https://x.example/simple/", "https://x.example/", tmp_path, "https://t/",
                        tmp_path / "keys", "bot", _credentials=("bot", "s3cret-pw"))  # fmt: skip
    assert "s3cret-pw" not in repr(index)


def test_a_redirecting_upload_url_is_refused_and_gets_no_credentials(tmp_path: Path) -> None:
    """urllib would follow a 302 as a GET carrying the Authorization header: the probe follows
    none, and says where the URL leads."""
    import http.server
    import threading

    from release.errors import PublishError
    from release.trust.remote_index import check_credentials

    seen: list[str | None] = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/other/")
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/upload/"
        with pytest.raises(PublishError, match=r"redirects \(HTTP 302\) to http://.*/other/"):
            check_credentials(url, "bot", "wrong")
        assert len(seen) == 1  # the POST only, never a follow-up to the redirect's target
    finally:
        server.shutdown()


def test_a_tuf_dir_that_would_serve_private_keys_is_refused(tmp_path: Path) -> None:
    out, state, _ = signed_out_dir(tmp_path / "release", VERSION)
    target = ["--index", "http://127.0.0.1:9/simple/", "--tuf-url", "http://127.0.0.1:9/tuf/"]
    for served in (state / "served", state.parent):  # inside the state folder, or around it
        refused = _publish(out, state, [*target, "--tuf-dir", str(served)], _env())
        assert refused.returncode == 2
        assert "publish.tuf_dir: expected a folder apart from the state directory" in (
            refused.stderr
        )
