"""TUF protection of the index, end to end: a real pypiserver (via release.scripts.index_server)
serving
the publisher's python-tuf metadata, and the consumer's `verify --index` with ngclient.Updater.

Every attack is planted for real on the served files and must be refused with a clear message:
a tampered wheel, a rollback to an older timestamp, expired metadata, an unknown file, a wrong
key (TUF root of another repository; provenance key of another signer)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_sign import signed_envelope
from fixtures_wheels import build_wheel
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata
from tuf.api.serialization.json import JSONSerializer

from release.errors import PublishError, VerifyError
from release.manifest import TufKeys
from release.trust.index import EmbeddedIndex
from release.trust.publish import publish
from release.trust.release_version import PROVENANCE_PREFIX
from release.trust.sign import key_paths, load_signer
from release.trust.tuf_metadata import ROLES, TufRepository, repository_for
from release.trust.verify import parse_requirement, tuf_url_for, verify_release
from release.util.digests import sha256_file

pytestmark = pytest.mark.integration  # a real pypiserver, python-tuf and pip

USER = "activekv-publisher"
IMPORTS = ["activekv._probe"]
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Site:
    index: EmbeddedIndex
    state_dir: Path
    root: Path
    wheel: Path

    @property
    def tuf(self) -> TufRepository:
        return TufRepository(self.index.tuf_dir)

    @property
    def trusted_root(self) -> Path:
        return self.tuf.trusted_root_path

    @property
    def provenance_key(self) -> Path:
        return key_paths(self.state_dir, "dev")[1]

    def publish(self, wheels: list[Path], version: str = "0.1.0") -> None:
        envelope = signed_envelope(
            wheels, self.state_dir, self.root / f"{version}.intoto.json", version=version
        )
        publish(wheels, self.index, envelope=envelope, metadata_dir=self.index.provenance_dir,
                tuf=self.tuf)  # fmt: skip

    def verify(self, work: Path, requirement: str = "activekv==0.1.0", **overrides: object):
        arguments: dict[str, object] = {
            "index_url": self.index.simple_url, "requirement": requirement,
            "trusted_root": self.trusted_root, "provenance_key": self.provenance_key,
            "interpreters": [Path(sys.executable)], "imports": IMPORTS,
            "workdir": work / "verify", "cache_dir": work / "tuf-cache",
        }  # fmt: skip
        arguments.update(overrides)
        return verify_release(**arguments)  # type: ignore[arg-type]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    state_dir = tmp_path / "state"
    wheel = build_wheel(tmp_path / "dist")
    with EmbeddedIndex(state_dir, USER) as index:
        served = Site(index, state_dir, tmp_path, wheel)
        served.publish([wheel])
        yield served


# ----------------------------------------------------------------------------- publisher side


def test_publish_maintains_tuf_metadata_for_every_file_and_the_statement(site: Site) -> None:
    targets = site.tuf.targets()
    assert set(targets) == {site.wheel.name, f"{PROVENANCE_PREFIX}activekv-0.1.0.intoto.json"}
    assert targets[site.wheel.name].length == site.wheel.stat().st_size
    served = site.index.tuf_url + "metadata/"
    for name in ("1.root.json", "timestamp.json", "2.snapshot.json", "2.targets.json"):
        with urllib.request.urlopen(served + name, timeout=10) as response:
            assert Metadata.from_bytes(response.read()).signed.type in name
    # the keys are never served
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(site.index.tuf_url + "metadata/../keys/root.pem", timeout=10)
    assert refused.value.code in (403, 404)


def test_a_publish_says_what_it_uploaded_stored_and_committed(site: Site, tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist-0.2.0", version="0.2.0")
    envelope = signed_envelope([wheel], site.state_dir, tmp_path / "0.2.0.intoto.json", "0.2.0")
    again = [wheel], site.index
    first = publish(*again, envelope=envelope, metadata_dir=site.index.provenance_dir,
                    tuf=site.tuf)  # fmt: skip
    assert first.message == (
        f"activekv 0.2.0: uploaded 1 file(s): {wheel.name}; stored its signed statement; "
        "committed 2 new TUF target(s) (targets version 3, timestamp 3)"
    )
    second = publish(*again, envelope=envelope, metadata_dir=site.index.provenance_dir,
                     tuf=site.tuf)  # fmt: skip
    assert second.message == "activekv 0.2.0 already exists on the index; nothing uploaded"


def test_republishing_the_same_files_signs_nothing_new(site: Site) -> None:
    before = (site.index.tuf_dir / "metadata" / "timestamp.json").read_bytes()
    site.publish([site.wheel])
    assert (site.index.tuf_dir / "metadata" / "timestamp.json").read_bytes() == before


def test_a_target_is_never_given_other_bytes(site: Site, tmp_path: Path) -> None:
    other = build_wheel(tmp_path / "other", salt="rebuilt")
    before = sorted(p.name for p in (site.index.tuf_dir / "metadata").iterdir())
    with pytest.raises(PublishError, match=rf"TUF targets already name other bytes.*{other.name}"):
        site.tuf.add_targets({other.name: other})
    assert sorted(p.name for p in (site.index.tuf_dir / "metadata").iterdir()) == before


def test_a_file_the_index_lost_is_not_replaced_by_other_bytes(site: Site, tmp_path: Path) -> None:
    (site.index.packages_dir / site.wheel.name).unlink()  # the index lost a published file
    rebuilt = build_wheel(tmp_path / "rebuilt", salt="other bytes")
    with pytest.raises(
        PublishError, match=rf"fixed by the first publish.*other bytes: {rebuilt.name}"
    ):
        site.publish([rebuilt])
    # with the stored statement lost too, the TUF targets still refuse it
    (site.index.provenance_dir / "activekv-0.1.0.intoto.json").unlink()
    with pytest.raises(
        PublishError, match=rf"TUF targets already name other bytes for {rebuilt.name}"
    ):
        site.publish([rebuilt])
    assert not (site.index.packages_dir / rebuilt.name).exists()  # refused before uploading


def test_uncommitted_metadata_of_a_killed_update_is_ignored_and_completed(site: Site) -> None:
    metadata = site.index.tuf_dir / "metadata"
    # a run killed after writing its targets but before its timestamp left a stray version
    (metadata / "3.targets.json").write_text("{ half written")
    second = build_wheel(site.root / "dist", version="0.2.0")
    site.publish([second], version="0.2.0")
    assert second.name in site.tuf.targets()
    assert Metadata.from_file(str(metadata / "3.targets.json")).signed.version == 3


# ----------------------------------------------------------------------------- consumer side


def test_verify_passes_for_what_was_published(site: Site, tmp_path: Path) -> None:
    verified = site.verify(tmp_path)
    assert verified.files == {site.wheel.name: sha256_file(site.wheel)}
    (check,) = verified.checks
    assert check.wheel == site.wheel.name
    assert check.digest_ok and check.imported == tuple(IMPORTS)


def test_verify_cli_with_only_url_root_and_key(site: Site, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "release", "verify", "--index", site.index.simple_url,
        "activekv==0.1.0", "--root", str(site.trusted_root),
        "--provenance-key", str(site.provenance_key), "--tuf-cache", str(tmp_path / "cache"),
        "--out", str(tmp_path / "out"), "--python", sys.executable, "--import", IMPORTS[0],
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "matches its TUF target and the signed statement" in result.stdout


def test_tampered_wheel_is_refused(site: Site, tmp_path: Path) -> None:
    stored = site.index.packages_dir / site.wheel.name
    tampered = build_wheel(tmp_path / "evil", module_text="VALUE = 666\n")
    shutil.copyfile(tampered, stored)  # pypiserver now lists the new bytes' digest itself
    with pytest.raises(VerifyError, match=r"does not match its TUF target.*tampered file"):
        site.verify(tmp_path)
    assert not list((tmp_path / "verify").glob("py*/venv/lib/python*/site-packages/activekv"))


def test_rollback_to_an_older_timestamp_is_refused(site: Site, tmp_path: Path) -> None:
    served = site.index.tuf_dir / "metadata" / "timestamp.json"
    old = served.read_bytes()
    site.publish([build_wheel(site.root / "dist", version="0.2.0")], version="0.2.0")
    site.verify(tmp_path)  # the consumer has now seen the newer timestamp
    served.write_bytes(old)
    with pytest.raises(VerifyError, match=r"older than what this consumer has already seen"):
        site.verify(tmp_path)


def test_rollback_is_refused_whatever_url_reaches_the_repository(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer's default cache belongs to the repository's root keys: after it saw the
    newer timestamp, the older one is refused at another host name and at another port."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    served = site.index.tuf_dir / "metadata" / "timestamp.json"
    old = served.read_bytes()
    site.publish([build_wheel(site.root / "dist", version="0.2.0")], version="0.2.0")
    site.verify(tmp_path / "seen", cache_dir=None)
    served.write_bytes(old)
    by_name = site.index.simple_url.replace("127.0.0.1", "localhost")
    with pytest.raises(VerifyError, match=r"older than what this consumer has already seen"):
        site.verify(tmp_path / "by-name", cache_dir=None, index_url=by_name)
    with EmbeddedIndex(site.state_dir, USER) as restarted:
        assert restarted.url != site.index.url
        with pytest.raises(VerifyError, match=r"older than what this consumer has already seen"):
            site.verify(tmp_path / "restarted", cache_dir=None, index_url=restarted.simple_url)
    assert len(list((tmp_path / "home").rglob("timestamp.json"))) == 1  # one cache for all URLs


def test_expired_metadata_is_refused(site: Site, tmp_path: Path) -> None:
    # a frozen index: metadata signed long ago and served after its expiry
    site.tuf.refresh_timestamp(now=datetime.now(timezone.utc) - timedelta(days=3))
    with pytest.raises(VerifyError, match=r"has expired.*stale or frozen"):
        site.verify(tmp_path)


def test_unknown_file_is_refused(site: Site, tmp_path: Path) -> None:
    # A file the publisher never signed, put on the index behind its back, with a tag pip
    # prefers for this interpreter over the signed py3-none-any wheel.
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}-none-any"
    stray = build_wheel(tmp_path / "stray", tag=tag)
    shutil.copyfile(stray, site.index.packages_dir / stray.name)
    with pytest.raises(VerifyError, match=rf"{stray.name} is not a TUF target.*unknown file"):
        site.verify(tmp_path)


def test_version_without_signed_statement_is_refused(site: Site, tmp_path: Path) -> None:
    stray = build_wheel(tmp_path / "stray", version="0.2.0")
    shutil.copyfile(stray, site.index.packages_dir / stray.name)
    with pytest.raises(VerifyError, match=r"provenance/activekv-0.2.0.intoto.json is not a TUF"
                       r".*: activekv 0\.2\.0 is not published there") as caught:  # fmt: skip
        site.verify(tmp_path, requirement="activekv==0.2.0")
    assert "never signed" not in str(caught.value)  # not a stray file: no such release


def test_a_version_never_published_is_said_to_be_so(site: Site, tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match=r": activekv 9\.9 is not published there \(its "
                       r"publisher signed no statement for that version\)$"):  # fmt: skip
        site.verify(tmp_path, requirement="activekv==9.9")


def test_a_provenance_key_that_is_not_one_is_named_by_its_flag(site: Site, tmp_path: Path) -> None:
    bad = tmp_path / "bad.pub.json"
    bad.write_text("{not json")
    with pytest.raises(VerifyError, match=r"^--provenance-key: expected the provenance signer's "
                       r"public key .*bad\.pub\.json: not a readable public key file"):  # fmt: skip
        site.verify(tmp_path, provenance_key=bad)


def test_statement_of_another_version_is_refused(site: Site, tmp_path: Path) -> None:
    """Even signed by both keys, 0.1.0's statement cannot vouch for 0.2.0."""
    newer = build_wheel(tmp_path / "newer", version="0.2.0")
    shutil.copyfile(newer, site.index.packages_dir / newer.name)
    misplaced = site.index.provenance_dir / "activekv-0.2.0.intoto.json"
    shutil.copyfile(site.index.provenance_dir / "activekv-0.1.0.intoto.json", misplaced)
    site.tuf.add_targets({newer.name: newer, f"{PROVENANCE_PREFIX}{misplaced.name}": misplaced})
    with pytest.raises(VerifyError, match=r"is for version '0\.1\.0', not '0\.2\.0'"):
        site.verify(tmp_path, requirement="activekv==0.2.0")


def test_root_of_another_repository_is_refused(site: Site, tmp_path: Path) -> None:
    other = TufRepository(tmp_path / "other-tuf")
    other.add_targets({})
    with pytest.raises(VerifyError, match=r"not signed by the keys of the trusted root"):
        site.verify(tmp_path, trusted_root=other.trusted_root_path)


def test_metadata_signed_by_a_wrong_key_is_refused(site: Site, tmp_path: Path) -> None:
    # someone without the timestamp key serves a newer timestamp signed by a key of their own
    served = site.index.tuf_dir / "metadata" / "timestamp.json"
    forged = Metadata.from_file(str(served))
    forged.signed.version += 1
    forged.signatures.clear()
    forged.sign(CryptoSigner.generate_ed25519())
    served.write_bytes(forged.to_bytes(JSONSerializer(compact=False)))
    with pytest.raises(VerifyError, match=r"not signed by the keys of the trusted root"):
        site.verify(tmp_path)


def test_the_publisher_refuses_to_sign_with_a_key_the_root_does_not_name(site: Site) -> None:
    keys = site.index.tuf_dir / "keys"
    (keys / "timestamp.pem").unlink()
    (keys / "timestamp.pub.json").unlink()
    with pytest.raises(PublishError, match=r"TUF timestamp key: .*timestamp.pub.json"):
        site.tuf.refresh_timestamp()
    # another key put in its place
    load_signer("generate", channel="timestamp", state_dir=site.root / "elsewhere")
    stray_pem, stray_pub = key_paths(site.root / "elsewhere", "timestamp")
    shutil.copy2(stray_pem, keys / "timestamp.pem")
    shutil.copy2(stray_pub, keys / "timestamp.pub.json")
    before = sorted(site.index.tuf_dir.rglob("*"))
    with pytest.raises(PublishError, match=r"timestamp key is not one the root .* names"):
        site.publish([site.wheel])
    assert sorted(site.index.tuf_dir.rglob("*")) == before


def test_provenance_signed_by_another_key_is_refused(site: Site, tmp_path: Path) -> None:
    _, other_public = key_paths(tmp_path / "someone-else", "dev")
    load_signer("generate", channel="dev", state_dir=tmp_path / "someone-else")
    with pytest.raises(VerifyError, match=r"signed statement .*not by the expected key"):
        site.verify(tmp_path, provenance_key=other_public)


def test_tampered_statement_is_refused(site: Site, tmp_path: Path) -> None:
    stored = site.index.provenance_dir / "activekv-0.1.0.intoto.json"
    document = json.loads(stored.read_text())
    document["payloadType"] = document["payloadType"] + " "
    stored.write_text(json.dumps(document))
    with pytest.raises(VerifyError, match=r"does not match its TUF target.*tampered file"):
        site.verify(tmp_path)


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "text", ["activekv", "activekv>=0.1", "activekv==", "==0.1.0", "activekv==0.1==2", "a kv==1"]
)
def test_requirement_must_pin_one_version(text: str) -> None:
    with pytest.raises(VerifyError, match=r"expected exactly one pinned version, NAME==VERSION"):
        parse_requirement(text)


def test_tuf_url_is_beside_the_simple_index() -> None:
    assert tuf_url_for("http://127.0.0.1:8080/simple/") == "http://127.0.0.1:8080/tuf/"
    with pytest.raises(VerifyError, match=r"--index http://h/pkgs: .* give --tuf-url"):
        tuf_url_for("http://h/pkgs")


# ----------------------------------------------------------------------------- keys by reference


def _key_refs(tmp_path: Path, mode: int = 0o600) -> TufKeys:
    """A file: key reference of mode ``mode`` per TUF role."""
    refs = {}
    for role in ROLES:
        pem = CryptoSigner.generate_ed25519().private_bytes
        path = tmp_path / "keys" / f"{role}.pem"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pem)
        os.chmod(path, mode)
        refs[role] = {"key": f"file:{path}"}
    return TufKeys.model_validate(refs)


def test_stable_refuses_generated_tuf_keys(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match=r"publish\.tuf_keys: expected a key reference for each"):
        repository_for(tmp_path / "tuf", None, channel="stable", state_dir=tmp_path,
                       manifest_dir=tmp_path)  # fmt: skip
    assert not (tmp_path / "tuf").exists()


def test_tuf_keys_by_reference_sign_the_metadata(tmp_path: Path) -> None:
    keys = _key_refs(tmp_path)
    repository = repository_for(tmp_path / "tuf", keys, channel="stable", state_dir=tmp_path,
                                manifest_dir=tmp_path)  # fmt: skip
    wheel = build_wheel(tmp_path / "dist")
    repository.add_targets({wheel.name: wheel})
    root = Metadata.from_file(str(repository.trusted_root_path)).signed
    for role in ROLES:
        assert root.roles[role].keyids == [repository.signers[role][1].keyid]  # type: ignore[index]
    assert not (tmp_path / "tuf" / "keys").exists()  # nothing generated
    assert set(repository.targets()) == {wheel.name}


def test_tuf_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match=r"publish\.tuf_keys\.root: signing key .* mode 0644"):
        repository_for(tmp_path / "tuf", _key_refs(tmp_path, 0o644), channel="stable",
                       state_dir=tmp_path, manifest_dir=tmp_path)  # fmt: skip


def test_generate_is_not_a_tuf_key_reference(tmp_path: Path) -> None:
    refs = {role: {"key": "generate"} for role in ROLES}
    with pytest.raises(PublishError, match=r'tuf_keys\.root\.key: "generate" is not a key ref'):
        repository_for(tmp_path / "tuf", TufKeys.model_validate(refs), channel="dev",
                       state_dir=tmp_path, manifest_dir=tmp_path)  # fmt: skip


def test_configured_keys_that_the_root_does_not_name_are_refused(
    site: Site, tmp_path: Path
) -> None:
    """A repository made with generated keys cannot silently switch to other keys."""
    repository = repository_for(site.index.tuf_dir, _key_refs(tmp_path), channel="dev",
                                state_dir=tmp_path, manifest_dir=tmp_path)  # fmt: skip
    with pytest.raises(PublishError, match=r"\[publish\.tuf_keys\.root\]: the TUF root key is not"):
        repository.refresh_timestamp()
