"""Every key a publish needs is loaded before its first upload: a TUF role whose private key is
missing (a generated dev key's PEM gone, or a `[publish.tuf_keys]` file that does not exist)
refuses the publish in one line naming the role and the file, and the index holds nothing of the
version afterwards: no wheel, no statement, no TUF target. Real pypiserver indexes (the embedded
one, and a standalone one as an operator runs it) and real `python -m release publish` runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_sign import signed_envelope, signed_out_dir
from fixtures_wheels import build_wheel
from index_servers import PypiServer, StaticServer
from securesystemslib.signer import CryptoSigner

from release.errors import PublishError
from release.trust.index import EmbeddedIndex, list_project_files
from release.trust.publish import publish
from release.trust.remote_index import ENV_PASSWORD, ENV_USERNAME
from release.trust.tuf_metadata import ROLES, TufRepository
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.pins import project_version

pytestmark = pytest.mark.integration  # real pypiserver indexes, twine and the command line

VERSION = project_version()


def _release(*args: str | Path, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, "-m", "release", *map(str, args)], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return " ".join(result.stderr.split())


# ------------------------------------------------------------------------ the library's publish


@pytest.fixture
def index(tmp_path: Path) -> Iterator[EmbeddedIndex]:
    with EmbeddedIndex(tmp_path / "state", "activekv-publisher") as running:
        yield running


def _publish(index: EmbeddedIndex, tmp: Path, version: str) -> None:
    wheel = build_wheel(tmp / f"dist-{version}", version=version)
    envelope = signed_envelope([wheel], tmp / "state", tmp / f"{version}.intoto.json", version)
    publish([wheel], index, envelope=envelope, metadata_dir=index.provenance_dir,
            tuf=TufRepository(index.tuf_dir))  # fmt: skip


@pytest.mark.parametrize("role", ROLES)
def test_a_lost_tuf_private_key_refuses_the_publish_before_it_uploads(
    index: EmbeddedIndex, tmp_path: Path, role: str
) -> None:
    _publish(index, tmp_path, "0.1.0")
    listed = list_project_files(index.simple_url, "activekv")
    targets = TufRepository(index.tuf_dir).targets()
    pem = index.tuf_dir / "keys" / f"{role}.pem"
    pem.unlink()
    with pytest.raises(PublishError) as refused:
        _publish(index, tmp_path, "0.2.0")
    assert str(refused.value) == (
        f"TUF {role} key: {pem.with_suffix('.pub.json')} exists but its private key {pem} does "
        "not; restore the private key, or remove the public key to generate a new pair"
    )
    assert list_project_files(index.simple_url, "activekv") == listed  # nothing uploaded
    assert not (index.provenance_dir / "activekv-0.2.0.intoto.json").exists()
    assert TufRepository(index.tuf_dir).targets() == targets


# ----------------------------------------------------------------------------- the command line


@pytest.fixture
def pypiserver(tmp_path: Path) -> Iterator[PypiServer]:
    with PypiServer(tmp_path / "pypiserver") as running:
        yield running


@pytest.fixture
def tuf_server(tmp_path: Path) -> Iterator[StaticServer]:
    with StaticServer(tmp_path / "served-tuf") as running:
        yield running


def test_a_remote_publish_whose_tuf_timestamp_key_is_lost_uploads_nothing(
    pypiserver: PypiServer, tuf_server: StaticServer, tmp_path: Path
) -> None:
    """The operator's TUF repository exists (its dev keys under the state directory); the
    timestamp role's private key is lost: the publish is refused before anything reaches the
    index or the served folder."""
    out, state, _ = signed_out_dir(tmp_path / "release", VERSION)
    keys = state / "remote-index" / "tuf-keys"
    TufRepository(tuf_server.folder, keys_directory=keys).refresh_timestamp()
    served = sorted(p.relative_to(tuf_server.folder) for p in tuf_server.folder.rglob("*"))
    (keys / "timestamp.pem").unlink()
    env = {**os.environ, ENV_USERNAME: pypiserver.username, ENV_PASSWORD: pypiserver.password}
    refused = _release("publish", "--out", out, "--state-dir", state, "--index",
                       pypiserver.simple_url, "--tuf-dir", tuf_server.folder, "--tuf-url",
                       tuf_server.url, env=env)  # fmt: skip
    assert list_project_files(pypiserver.simple_url, "activekv") == {}
    assert sorted(p.relative_to(tuf_server.folder) for p in tuf_server.folder.rglob("*")) == served
    message = _one_line_error(refused)
    assert f"TUF timestamp key: {keys / 'timestamp.pub.json'} exists but its private key" in message


def test_a_tuf_key_file_the_manifest_names_that_does_not_exist_uploads_nothing(
    tmp_path: Path,
) -> None:
    """`[publish.tuf_keys.timestamp]` names a PEM file that is not there (the other roles' are):
    refused in one line naming the role and the file; the embedded index holds nothing."""
    out, state, _ = signed_out_dir(tmp_path / "release", VERSION)
    keys = tmp_path / "tuf-keys"
    keys.mkdir(mode=0o700)
    tables = []
    for role in ROLES:
        pem = keys / f"{role}.pem"
        if role != "timestamp":
            pem.write_bytes(CryptoSigner.generate_ed25519().private_bytes)
            pem.chmod(0o600)
        tables.append(f'[publish.tuf_keys.{role}]\nkey = "file:{pem}"\n')
    manifest = tmp_path / "manifest" / "activekv.toml"
    manifest.parent.mkdir()
    manifest.write_text(DEFAULT_MANIFEST.read_text() + "\n" + "\n".join(tables))
    refused = _release("publish", "--manifest", manifest, "--out", out, "--state-dir", state)
    packages, statements = state / "index" / "packages", state / "index" / "metadata"
    assert not packages.exists() or not list(packages.iterdir())  # nothing uploaded
    assert not statements.exists() or not list(statements.glob("*.intoto.json"))
    message = _one_line_error(refused)
    assert "publish.tuf_keys.timestamp: " in message and str(keys / "timestamp.pem") in message
