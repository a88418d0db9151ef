"""The publisher against a second real index: devpi-server (non-volatile stage index, twine
uploads with basic auth), so publishing is not tied to pypiserver."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_sign import signed_envelope
from fixtures_wheels import build_wheel

from release.errors import PackageIndexError, PublishError
from release.trust.devpi import DevpiIndex
from release.trust.index import list_project_files
from release.trust.publish import ALREADY_PRESENT, UPLOADED, publish
from release.trust.tuf_metadata import PROVENANCE_PREFIX, TufRepository
from release.util.digests import sha256_file

pytestmark = pytest.mark.devpi


@pytest.fixture(scope="module")
def devpi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevpiIndex]:
    with DevpiIndex(tmp_path_factory.mktemp("devpi") / "server") as index:
        yield index


def test_publish_to_devpi_uploads_then_skips_then_refuses_other_bytes(
    devpi: DevpiIndex, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    tuf = TufRepository(state / "tuf")
    wheels = [
        build_wheel(tmp_path / "dist", version="1.0.0"),
        build_wheel(tmp_path / "dist", version="1.0.0", tag="cp311-cp311-manylinux_2_28_x86_64"),
    ]
    envelope = signed_envelope(wheels, state, tmp_path / "1.0.0.intoto.json", version="1.0.0")
    first = publish(wheels, devpi, envelope=envelope, metadata_dir=state / "metadata", tuf=tuf)
    assert {f.filename: f.outcome for f in first.files} == {w.name: UPLOADED for w in wheels}
    listed = list_project_files(devpi.simple_url, "activekv")
    assert listed == {w.name: sha256_file(w) for w in wheels}
    assert set(tuf.targets()) == {w.name for w in wheels} | {
        f"{PROVENANCE_PREFIX}activekv-1.0.0.intoto.json"
    }

    again = publish(wheels, devpi, envelope=envelope, metadata_dir=state / "metadata", tuf=tuf)
    assert {f.outcome for f in again.files} == {ALREADY_PRESENT}

    rebuilt = build_wheel(tmp_path / "rebuilt", version="1.0.0", salt="other bytes")
    other = signed_envelope([rebuilt], state, tmp_path / "other.intoto.json", version="1.0.0")
    # Refused by the version's file set, fixed by its first publish; without that statement, by
    # the publisher's TUF targets; without those too, by the index's listing.
    with pytest.raises(PublishError, match=r"fixed by the first publish that started it"):
        publish([rebuilt], devpi, envelope=other, metadata_dir=state / "metadata", tuf=tuf)
    elsewhere = tmp_path / "another-publisher"
    with pytest.raises(PublishError, match=r"TUF targets already name other bytes"):
        publish([rebuilt], devpi, envelope=other, metadata_dir=elsewhere, tuf=tuf)
    with pytest.raises(PublishError, match=r"already has different bytes.*Nothing was uploaded"):
        publish([rebuilt], devpi, envelope=other, metadata_dir=elsewhere)
    assert not elsewhere.exists()  # nothing stored by a refused publish
    assert list_project_files(devpi.simple_url, "activekv") == listed


def test_devpi_itself_refuses_to_overwrite_a_file(devpi: DevpiIndex, tmp_path: Path) -> None:
    """Defence in depth: even a direct twine upload past the publisher's check is refused."""
    original = build_wheel(tmp_path / "a", version="2.0.0")
    state = tmp_path / "state"
    envelope = signed_envelope([original], state, tmp_path / "2.0.0.intoto.json", version="2.0.0")
    publish([original], devpi, envelope=envelope, metadata_dir=state / "metadata")
    replacement = build_wheel(tmp_path / "b", version="2.0.0", salt="replacement")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINE_")}
    env.update(TWINE_USERNAME=devpi.username, TWINE_PASSWORD=devpi.password)
    result = subprocess.run(
        [sys.executable, "-m", "twine", "upload", "--non-interactive", "--disable-progress-bar",
         "--repository-url", devpi.url, str(replacement)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "409" in result.stdout + result.stderr
    assert "already exists in non-volatile index" in result.stdout + result.stderr
    listed = list_project_files(devpi.simple_url, "activekv")
    assert listed[original.name] == sha256_file(original)


def test_a_reopened_server_directory_keeps_its_files_and_password(tmp_path: Path) -> None:
    server_dir = tmp_path / "devpi" / "server"
    server_dir.parent.mkdir()
    wheel = build_wheel(tmp_path / "dist", version="3.0.0")
    state = tmp_path / "state"
    envelope = signed_envelope([wheel], state, tmp_path / "3.0.0.intoto.json", version="3.0.0")
    with DevpiIndex(server_dir) as first:
        password = first.password
        publish([wheel], first, envelope=envelope, metadata_dir=state / "metadata")
    assert oct(DevpiIndex(server_dir).password_path.stat().st_mode & 0o777) == "0o600"
    with DevpiIndex(server_dir) as reopened:
        assert reopened.password == password
        assert list_project_files(reopened.simple_url, "activekv") == {
            wheel.name: sha256_file(wheel)
        }
        again = publish([wheel], reopened, envelope=envelope, metadata_dir=state / "metadata")
        assert {f.outcome for f in again.files} == {ALREADY_PRESENT}
        # the reopened index still authenticates uploads with the kept password
        later = build_wheel(tmp_path / "later", version="3.0.0", tag="cp311-cp311-linux_x86_64")
        both = signed_envelope([wheel, later], state, tmp_path / "b.intoto.json", version="3.0.0")
        published = publish([wheel, later], reopened, envelope=both, metadata_dir=tmp_path / "m")
        assert {f.filename: f.outcome for f in published.files} == {
            wheel.name: ALREADY_PRESENT,
            later.name: UPLOADED,
        }


def test_a_server_directory_without_its_password_is_refused_by_name(tmp_path: Path) -> None:
    server_dir = tmp_path / "server"
    with DevpiIndex(server_dir):
        pass
    (tmp_path / "server.password").unlink()
    with pytest.raises(PackageIndexError, match=r"server\.password: cannot read the publisher"):
        DevpiIndex(server_dir).__enter__()
