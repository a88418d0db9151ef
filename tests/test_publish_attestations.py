"""The gate attestations a release's statement names, as a publish stores them beside it: the set
stored is always the one the kept statement names. One left by a publish killed before it stored
its statement is replaced; one a stored statement names is never replaced. Real pypiserver, twine,
TUF and DSSE envelopes; the consumer's verify checks the result."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_sign import TAGS, attest_passing_gates
from fixtures_wheels import build_wheel

from release import catalogue
from release.errors import PublishError
from release.manifest import load_manifest
from release.statement import read_statement_unverified
from release.trust.attestation import (
    attestation_path,
    provenance_entry,
    published_name,
    read_attestation,
)
from release.trust.index import EmbeddedIndex
from release.trust.publish import PublishReport, publish
from release.trust.release_version import attestation_target
from release.trust.sign import (
    build_statement,
    key_paths,
    load_signer,
    sign_statement,
    write_envelope,
)
from release.trust.statement_store import attachments_dir_for
from release.trust.tuf_metadata import TufRepository
from release.trust.verify import verify_release
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST

pytestmark = pytest.mark.integration  # a real pypiserver, twine, python-tuf and pip

USER = "activekv-publisher"
GATES = load_manifest(DEFAULT_MANIFEST).channel("dev").requires


@dataclass(frozen=True)
class Signing:
    """One run of the gates and the sign step: its envelope and its attestations (name to file)."""

    envelope: Path
    attestations: dict[str, Path]

    @property
    def digests(self) -> dict[str, str]:
        return {name: sha256_file(path) for name, path in self.attestations.items()}


def _sign(wheels: list[Path], state: Path, out: Path) -> Signing:
    """The gates attest the wheels again (a new time, so new bytes) and a statement naming those
    attestations is signed with the dev key, as `python -m release sign` does."""
    attest_passing_gates(out, wheels, state)
    signer, key = load_signer("generate", channel="dev", state_dir=state)
    read = {gate: read_attestation(attestation_path(out, gate), {key.keyid: key}, "the dev key")
            for gate in GATES}  # fmt: skip
    started = datetime.now(timezone.utc)
    statement = build_statement(
        wheels, version="0.1.0", channel="dev", manifest_path=Path("manifests/activekv.toml"),
        manifest_sha256="0" * 64, source_commit=None, source_date_epoch=1_700_000_000,
        toolchain={"python": "3"}, started=started, finished=started + timedelta(seconds=1),
        gates=GATES,
        attestations=[provenance_entry(a, catalogue.runner_of(g)) for g, a in read.items()],
    )  # fmt: skip
    envelope = out / "provenance" / "activekv-0.1.0.intoto.json"
    envelope.parent.mkdir(parents=True, exist_ok=True)
    write_envelope(sign_statement(statement, signer), envelope)
    return Signing(envelope, {published_name(g): a.path for g, a in read.items()})


@dataclass(frozen=True)
class Site:
    index: EmbeddedIndex
    state: Path
    wheels: list[Path]
    root: Path

    @property
    def tuf(self) -> TufRepository:
        return TufRepository(self.index.tuf_dir)

    @property
    def attached(self) -> Path:
        """Where the publish stores the release's attestations."""
        return attachments_dir_for(self.index.provenance_dir, "activekv", "0.1.0")

    @property
    def statement(self) -> Path:
        return self.index.provenance_dir / "activekv-0.1.0.intoto.json"

    def sign(self, name: str) -> Signing:
        return _sign(self.wheels, self.state, self.root / name)

    def publish(self, signing: Signing) -> PublishReport:
        return publish(self.wheels, self.index, envelope=signing.envelope,
                       metadata_dir=self.index.provenance_dir, tuf=self.tuf,
                       attachments=signing.attestations)  # fmt: skip

    def stored(self) -> dict[str, tuple[str, int]]:
        """Name to (sha256, inode) of each stored attestation."""
        return {p.name: (sha256_file(p), p.stat().st_ino) for p in sorted(self.attached.iterdir())}

    def named_by_stored_statement(self) -> dict[str, str]:
        entries = read_statement_unverified(self.statement)["predicate"]["runDetails"]
        return {e["name"]: e["digest"]["sha256"] for e in entries["byproducts"]}

    def uploads(self) -> int:
        return self.index.log_path.read_text().count('"POST / HTTP')


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    state = tmp_path / "state"
    wheels = [build_wheel(tmp_path / "dist", tag=tag) for tag in TAGS]
    with EmbeddedIndex(state, USER) as index:
        yield Site(index, state, wheels, tmp_path)


def _consumer_verify(site: Site, work: Path) -> None:
    verify_release(
        index_url=site.index.simple_url, requirement="activekv==0.1.0",
        trusted_root=site.tuf.trusted_root_path, provenance_key=key_paths(site.state, "dev")[1],
        interpreters=[Path(sys.executable)], imports=["activekv._probe"], workdir=work / "verify",
        cache_dir=work / "tuf-cache",
    )  # fmt: skip


def test_an_attestation_a_killed_publish_left_without_its_statement_is_replaced(
    site: Site, tmp_path: Path
) -> None:
    """What a publish killed after storing its attestations and before its statement leaves
    (attestations of its own signing, no statement); then the gates and sign run again and the
    new publish completes the version with its own attestations, which a consumer verifies."""
    first, second = site.sign("first"), site.sign("second")
    assert set(first.digests.values()).isdisjoint(second.digests.values())  # re-attested
    site.attached.mkdir(parents=True)
    for name, path in first.attestations.items():
        shutil.copyfile(path, site.attached / name)
    assert not site.statement.exists()

    report = site.publish(second)

    assert report.envelope_stored and site.statement.read_bytes() == second.envelope.read_bytes()
    assert {n: d for n, (d, _) in site.stored().items()} == second.digests
    assert site.named_by_stored_statement() == second.digests
    targets = site.tuf.targets()
    for name, digest in second.digests.items():
        assert targets[attestation_target("activekv", "0.1.0", name)].hashes["sha256"] == digest
    _consumer_verify(site, tmp_path)


def test_an_attestation_a_stored_statement_names_is_never_replaced(site: Site) -> None:
    """The control of the test above: with the statement stored, a publish signed again (other
    attestations) keeps the stored ones, byte for byte and file for file, and changes nothing."""
    first, second = site.sign("first"), site.sign("second")
    site.publish(first)
    before, uploads = site.stored(), site.uploads()

    report = site.publish(second)

    assert not report.envelope_stored and report.uploaded == ()
    assert site.stored() == before and site.uploads() == uploads
    assert {n: d for n, (d, _) in before.items()} == site.named_by_stored_statement()


def test_a_stored_attestation_its_statement_does_not_name_refuses_until_its_bytes_are_given(
    site: Site, tmp_path: Path
) -> None:
    """A stored statement whose attestation on disk has other bytes (here: another signing's):
    a publish that cannot give the bytes the statement names is refused before anything is
    uploaded or replaced; re-running the publish that stored the statement puts them back."""
    first, second = site.sign("first"), site.sign("second")
    site.publish(first)
    name = published_name(GATES[0])
    shutil.copyfile(second.attestations[name], site.attached / name)
    before, uploads = site.stored(), site.uploads()

    with pytest.raises(PublishError) as caught:
        site.publish(second)
    message = str(caught.value)
    assert message.startswith(f"{site.attached / name}: the statement of activekv 0.1.0")
    assert f"names this attestation with sha256 {first.digests[name]}" in message
    assert f"there is sha256 {second.digests[name]}" in message
    assert "Nothing was uploaded" in message
    assert site.stored() == before and site.uploads() == uploads

    site.publish(first)
    assert {n: d for n, (d, _) in site.stored().items()} == first.digests
    _consumer_verify(site, tmp_path)


def test_an_envelope_must_name_exactly_the_attestations_given(site: Site) -> None:
    first, second = site.sign("first"), site.sign("second")
    name = published_name(GATES[0])
    mixed = {**first.attestations, name: second.attestations[name]}
    with pytest.raises(PublishError, match=rf"does not cover exactly the files to publish: "
                       rf"{name} \(local sha256 {second.digests[name]}, statement sha256 "
                       rf"{first.digests[name]}\)"):  # fmt: skip
        publish(site.wheels, site.index, envelope=first.envelope,
                metadata_dir=site.index.provenance_dir, attachments=mixed)  # fmt: skip
    assert not site.statement.exists() and not site.attached.exists()
