"""The embedded index and the publish step against a real pypiserver with htpasswd auth, real
twine uploads and real DSSE envelopes."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import stat
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures_sign import signed_envelope
from fixtures_wheels import build_wheel

from release.errors import PackageIndexError, PublishError
from release.trust.index import EmbeddedIndex, list_project_files
from release.trust.publish import ALREADY_PRESENT, UPLOADED, publish
from release.trust.statement_store import LOCK_NAME, envelope_path_for
from release.trust.tuf_metadata import TufRepository
from release.util.digests import sha256_file

pytestmark = pytest.mark.integration  # a real pypiserver with htpasswd auth and twine uploads

USER = "activekv-publisher"
MANYLINUX = "py3-none-manylinux_2_17_x86_64"


def _server_files(index: EmbeddedIndex) -> dict[str, tuple[int, int, str]]:
    """name -> (inode, mtime_ns, sha256) of what the server stores."""
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns, sha256_file(p))
        for p in sorted(index.packages_dir.iterdir())
    }


def _upload_requests(index: EmbeddedIndex) -> int:
    """How many upload requests the server has logged (accepted or not)."""
    return index.log_path.read_text().count('"POST / HTTP')


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def index(state_dir: Path) -> Iterator[EmbeddedIndex]:
    with EmbeddedIndex(state_dir, USER) as running:
        yield running


# ----------------------------------------------------------------------------- the index


def _multipart_upload(url: str, wheel: Path, auth: tuple[str, str] | None) -> int:
    boundary = "----activekv-test-boundary"
    parts = []
    for name, value in ((":action", "file_upload"), ("name", "activekv"), ("version", "0.1.0")):
        header = f'Content-Disposition: form-data; name="{name}"'
        parts.append(f"--{boundary}\r\n{header}\r\n\r\n{value}\r\n".encode())
    parts.append(
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="content"; '
            f'filename="{wheel.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        + wheel.read_bytes()
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    request = urllib.request.Request(
        url + "/",
        data=b"".join(parts),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        method="POST",
    )
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_upload_needs_the_right_credentials(index: EmbeddedIndex, tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    assert _multipart_upload(index.url, wheel, auth=None) == 401
    assert _multipart_upload(index.url, wheel, auth=(USER, "wrong-password")) == 403
    assert _multipart_upload(index.url, wheel, auth=("someone-else", index.password)) == 403
    assert list(index.packages_dir.iterdir()) == []
    assert list_project_files(index.simple_url, "activekv") == {}
    # and the right credentials are accepted: the control for the two refusals above
    assert _multipart_upload(index.url, wheel, auth=(USER, index.password)) == 200
    assert list_project_files(index.simple_url, "activekv") == {wheel.name: sha256_file(wheel)}
    # a re-upload is refused (409 to a client that is not twine), the file stays
    before = _server_files(index)
    assert _multipart_upload(index.url, wheel, auth=(USER, index.password)) == 409
    assert _server_files(index) == before


def test_state_files_are_private_and_hold_no_plain_password_in_htpasswd(
    index: EmbeddedIndex,
) -> None:
    credentials = index.credentials_path
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert json.loads(credentials.read_text()) == {"username": USER, "password": index.password}
    assert stat.S_IMODE(index.htpasswd_path.stat().st_mode) == 0o600
    htpasswd = index.htpasswd_path.read_text()
    assert htpasswd.startswith(f"{USER}:")
    assert index.password not in htpasswd
    assert len(index.password) >= 32


def test_unknown_project_lists_empty(index: EmbeddedIndex) -> None:
    # --disable-fallback: a 404, never a redirect to pypi.org
    assert list_project_files(index.simple_url, "no-such-project") == {}


def test_url_is_refused_when_not_running(state_dir: Path) -> None:
    with pytest.raises(PackageIndexError, match="not running"):
        _ = EmbeddedIndex(state_dir, USER).url


# ----------------------------------------------------------------------------- publish


def test_publish_uploads_and_the_index_lists_identical_digests(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    wheels = [build_wheel(tmp_path / "dist"), build_wheel(tmp_path / "dist", tag=MANYLINUX)]
    envelope = signed_envelope(wheels, state_dir, tmp_path / "envelope.json")
    metadata = state_dir / "metadata"

    report = publish(wheels, index, envelope=envelope, metadata_dir=metadata)

    assert sorted(report.uploaded) == sorted(w.name for w in wheels)
    assert report.already_present == ()
    assert {f.outcome for f in report.files} == {UPLOADED}
    assert "uploaded 2 file(s)" in report.message
    assert list_project_files(index.simple_url, "activekv") == {
        w.name: sha256_file(w) for w in wheels
    }
    assert {n: d for n, (_, _, d) in _server_files(index).items()} == {
        w.name: sha256_file(w) for w in wheels
    }
    assert report.envelope_stored
    assert report.envelope_path == envelope_path_for(metadata, "activekv", "0.1.0")
    assert report.envelope_path.read_bytes() == envelope.read_bytes()


def test_second_publish_of_the_same_files_uploads_nothing(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    wheels = [build_wheel(tmp_path / "dist"), build_wheel(tmp_path / "dist", tag=MANYLINUX)]
    envelope = signed_envelope(wheels, state_dir, tmp_path / "envelope.json")
    publish(wheels, index, envelope=envelope, metadata_dir=state_dir / "metadata")
    before, uploads_before = _server_files(index), _upload_requests(index)
    assert uploads_before == 2

    # a reproducible rebuild: same bytes, fresh files
    rebuilt = [
        build_wheel(tmp_path / "rebuilt"),
        build_wheel(tmp_path / "rebuilt", tag=MANYLINUX),
    ]
    assert [sha256_file(w) for w in rebuilt] == [sha256_file(w) for w in wheels]
    report = publish(rebuilt, index, envelope=envelope, metadata_dir=state_dir / "metadata")

    assert report.message == "activekv 0.1.0 already exists on the index; nothing uploaded"
    assert report.uploaded == ()
    assert {f.outcome for f in report.files} == {ALREADY_PRESENT}
    assert _server_files(index) == before  # same inode, mtime and bytes
    assert _upload_requests(index) == uploads_before  # twine was not even called


def test_rebuilt_wheel_with_different_bytes_is_refused_and_nothing_uploaded(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    first = build_wheel(tmp_path / "dist")
    publish(
        [first],
        index,
        envelope=signed_envelope([first], state_dir, tmp_path / "e1.json"),
        metadata_dir=state_dir / "metadata",
    )
    before = _server_files(index)
    first_digest = sha256_file(first)

    changed = build_wheel(tmp_path / "rebuilt", salt="non-reproducible")
    new_file = build_wheel(tmp_path / "rebuilt", tag=MANYLINUX)
    assert changed.name == first.name and sha256_file(changed) != first_digest
    envelope = signed_envelope([changed, new_file], state_dir, tmp_path / "e2.json")

    with pytest.raises(PublishError) as caught:
        publish([changed, new_file], index, envelope=envelope, metadata_dir=state_dir / "m2")
    message = str(caught.value)
    assert first.name in message
    assert first_digest in message and sha256_file(changed) in message
    assert "Nothing was uploaded" in message
    assert _server_files(index) == before  # not even the new manylinux file
    assert list_project_files(index.simple_url, "activekv") == {first.name: first_digest}
    assert not (state_dir / "m2").exists()


def test_a_new_file_not_named_by_the_stored_statement_is_refused(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    first = build_wheel(tmp_path / "dist")
    metadata = state_dir / "metadata"
    envelope = signed_envelope([first], state_dir, tmp_path / "e1.json")
    publish([first], index, envelope=envelope, metadata_dir=metadata)
    extra = build_wheel(tmp_path / "dist", tag=MANYLINUX)
    envelope = signed_envelope([first, extra], state_dir, tmp_path / "e2.json")
    with pytest.raises(PublishError, match="fixed by the first publish that started it") as caught:
        publish([first, extra], index, envelope=envelope, metadata_dir=metadata)
    assert f"not in it: {extra.name}" in str(caught.value)
    assert sorted(list_project_files(index.simple_url, "activekv")) == [first.name]


def test_an_envelope_that_does_not_cover_the_wheels_is_refused(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    signed = build_wheel(tmp_path / "dist")
    envelope = signed_envelope([signed], state_dir, tmp_path / "e.json")
    other = build_wheel(tmp_path / "other", salt="unsigned")
    with pytest.raises(PublishError, match="does not cover") as caught:
        publish([other], index, envelope=envelope, metadata_dir=state_dir / "metadata")
    assert other.name in str(caught.value) and sha256_file(other) in str(caught.value)
    assert list(index.packages_dir.iterdir()) == []


def test_envelope_is_stored_once_and_never_overwritten(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path / "dist")
    metadata = state_dir / "metadata"
    first_envelope = signed_envelope([wheel], state_dir, tmp_path / "e1.json")
    first = publish([wheel], index, envelope=first_envelope, metadata_dir=metadata)
    stored = first.envelope_path
    stored_bytes, stored_inode = stored.read_bytes(), stored.stat().st_ino

    # the same files signed again: a new statement (new invocation id), a different envelope
    second_envelope = signed_envelope([wheel], state_dir, tmp_path / "e2.json")
    assert second_envelope.read_bytes() != stored_bytes
    second = publish([wheel], index, envelope=second_envelope, metadata_dir=metadata)

    assert first.envelope_stored and not second.envelope_stored
    assert second.envelope_path == stored
    assert stored.read_bytes() == stored_bytes and stored.stat().st_ino == stored_inode
    # no temporary left behind (the lock publishes store under is kept, hidden)
    assert sorted(p.name for p in metadata.iterdir()) == [LOCK_NAME, stored.name]


@dataclass(frozen=True)
class _Target:
    url: str
    simple_url: str
    username: str
    password: str


def test_twine_failure_is_reported_with_the_password_redacted(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path / "dist")
    envelope = signed_envelope([wheel], state_dir, tmp_path / "e.json")
    wrong = "Wr0ng-" + index.password[::-1]
    target = _Target(index.url, index.simple_url, USER, wrong)
    with pytest.raises(PublishError) as caught:
        publish([wheel], target, envelope=envelope, metadata_dir=state_dir / "metadata")
    message = str(caught.value)
    assert "the index answered 403 Forbidden" in message and wheel.name in message
    assert wrong not in message and index.password not in message
    assert list(index.packages_dir.iterdir()) == []
    # The statement was stored first as the version's intent: the same files, with the right
    # credentials, complete it.
    report = publish([wheel], index, envelope=envelope, metadata_dir=state_dir / "metadata")
    assert report.uploaded == (wheel.name,) and not report.envelope_stored


def test_state_persists_across_two_index_sessions(state_dir: Path, tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    envelope = signed_envelope([wheel], state_dir, tmp_path / "e.json")
    with EmbeddedIndex(state_dir, USER) as first:
        publish([wheel], first, envelope=envelope, metadata_dir=state_dir / "metadata")
        password, htpasswd = first.password, first.htpasswd_path.read_bytes()
        first_url = first.url

    with EmbeddedIndex(state_dir, USER) as second:
        assert second.password == password
        assert second.htpasswd_path.read_bytes() == htpasswd
        assert list_project_files(second.simple_url, "activekv") == {wheel.name: sha256_file(wheel)}
        report = publish([wheel], second, envelope=envelope, metadata_dir=state_dir / "metadata")
        assert report.uploaded == ()
    # the first server really stopped
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(first_url + "/simple/", timeout=2)


def test_credentials_for_another_user_are_refused(state_dir: Path) -> None:
    with EmbeddedIndex(state_dir, USER):
        pass
    with pytest.raises(PackageIndexError, match="holds credentials for user"):
        EmbeddedIndex(state_dir, "another-user").__enter__()


def test_a_password_file_others_may_read_or_write_is_refused(tmp_path: Path) -> None:
    """An htpasswd of mode 0666 (anyone could add a user who may upload): the index is not
    started."""
    state = tmp_path / "state"
    index = EmbeddedIndex(state, USER)
    _ = index.password  # makes the state files
    index.htpasswd_path.chmod(0o666)
    with pytest.raises(PackageIndexError, match=r"htpasswd has mode 0666; the index's password"):
        _ = EmbeddedIndex(state, USER).password


def test_a_folder_the_publish_cannot_write_refuses_it_before_any_upload(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    """The TUF metadata folder is a file here (a write there fails, even for root): the publish
    is refused naming it, and nothing is uploaded."""
    wheel = build_wheel(tmp_path / "dist")
    envelope = signed_envelope([wheel], state_dir, tmp_path / "envelope.json")
    tuf = TufRepository(tmp_path / "tuf")
    tuf.directory.mkdir()
    tuf.metadata_dir.write_text("not a folder")
    with pytest.raises(PublishError, match=r"tuf/metadata: a publish writes here and cannot"):
        publish([wheel], index, envelope=envelope, metadata_dir=state_dir / "metadata", tuf=tuf)
    assert list_project_files(index.simple_url, "activekv") == {}
    assert _upload_requests(index) == 0


# ------------------------------------------------------------------ storage faults at the index


@contextlib.contextmanager
def _mounted(folder: Path, *options: str) -> Iterator[None]:
    """A small tmpfs mounted over ``folder`` (skips where mounting is not permitted)."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs",
                              str(folder)], capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _large_wheel(folder: Path) -> Path:
    """A wheel of about 1.4 MB that does not compress (random bytes)."""
    return build_wheel(folder, module_text=f"DATA = {os.urandom(1 << 20)!r}\n")


def test_a_full_disk_keeps_no_partial_file_and_names_the_cause(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    """The package folder on a 512 KiB filesystem: the upload fails saying so, nothing of the
    wheel stays on the index, and once space is freed the same publish completes."""
    wheel = _large_wheel(tmp_path / "dist")
    envelope = signed_envelope([wheel], state_dir, tmp_path / "e.json")
    metadata = state_dir / "metadata"
    with _mounted(index.packages_dir, "size=512k"):
        with pytest.raises(PublishError) as caught:
            publish([wheel], index, envelope=envelope, metadata_dir=metadata)
        assert os.listdir(index.packages_dir) == []  # no partial file, no temporary
        assert list_project_files(index.simple_url, "activekv") == {}
    message = str(caught.value)
    assert "\n" not in message
    assert f"twine upload of {wheel.name}" in message
    assert "the index answered 507 Insufficient Storage" in message
    assert "No space left on device (ENOSPC); nothing was kept" in message

    report = publish([wheel], index, envelope=envelope, metadata_dir=metadata)
    assert report.uploaded == (wheel.name,)
    assert list_project_files(index.simple_url, "activekv") == {wheel.name: sha256_file(wheel)}


def test_a_read_only_package_folder_is_named_as_the_cause(
    index: EmbeddedIndex, state_dir: Path, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path / "dist")
    envelope = signed_envelope([wheel], state_dir, tmp_path / "e.json")
    with _mounted(index.packages_dir, "size=1m", "ro"):
        with pytest.raises(PublishError, match=r"answered 507 Insufficient Storage: cannot store "
                           r".*: Read-only file system \(EROFS\)"):  # fmt: skip
            publish([wheel], index, envelope=envelope, metadata_dir=state_dir / "metadata")


def test_a_store_that_loses_a_race_replaces_nothing(tmp_path: Path) -> None:
    """Two uploads of one name pass pypiserver's existence check together: the second to link
    its file into place is refused, and the first's bytes stay."""
    from pypiserver.bottle_wrapper import HTTPError

    from release.scripts.index_server import _store_whole

    destination = tmp_path / "activekv-0.1.0-py3-none-any.whl"
    destination.write_bytes(b"first")
    with pytest.raises(HTTPError) as refused:
        _store_whole(io.BytesIO(b"second"), destination)
    assert refused.value.status_code == 409
    assert "another upload stored it first" in str(refused.value.body)
    assert destination.read_bytes() == b"first"
    assert os.listdir(tmp_path) == [destination.name]  # the temporary is gone
