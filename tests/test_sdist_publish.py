"""The sdist signed and published with the wheels, and checked by the consumer: `sign` names it
as a subject, `publish` uploads it beside them (real pypiserver, twine, TUF) and a consumer's
verify checks it against the statement, its TUF target and the payload attestation that judged
it. An sdist changed after its gates, or one no passing attestation names, is refused before
anything is signed; a published sdist is never replaced; a publisher that signs and publishes
an sdist no gate judged is caught by the consumer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_sign import TAGS, attest_passing_gates
from fixtures_wheels import build_wheel, wheel_set

from release import catalogue, records
from release.builder.record_build import record_build
from release.builder.sdist import StagedSdist
from release.errors import PublishError, VerifyError
from release.manifest import load_manifest
from release.records import SdistEntry
from release.trust.attestation import (
    attestation_path,
    provenance_entry,
    published_name,
    read_attestation,
)
from release.trust.index import EmbeddedIndex
from release.trust.publish import publish
from release.trust.sign import (
    build_statement,
    key_paths,
    load_signer,
    sign_statement,
    write_envelope,
)
from release.trust.tuf_metadata import TufRepository
from release.trust.verify import Verification, verify_release
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT

pytestmark = pytest.mark.integration  # a real pypiserver, twine, python-tuf and pip

USER = "activekv-publisher"
EPOCH = 1_700_000_000
SDIST = "activekv-0.1.0.tar.gz"


@dataclass(frozen=True)
class Built:
    out: Path
    state: Path
    wheels: list[Path]
    sdist: Path


def _built(root: Path, *, epoch: int = EPOCH, attest_sdist: bool = True) -> Built:
    """`root/out` as the build and the dev gates leave it: fixture wheels, the real sdist of this
    checkout, the build record naming both, and passing attestations (the payload gate's naming
    the sdist, unless `attest_sdist` is false)."""
    out, state = root / "out", root / "state"
    wheels = [build_wheel(out / "wheels", tag=tag) for tag in TAGS]
    with StagedSdist(REPO_ROOT, out, epoch) as staged:
        pass
    sdist = staged.built.path
    record = record_build(wheel_set(*wheels), REPO_ROOT)
    entry = SdistEntry(file=sdist.name, seconds=1.0, size=sdist.stat().st_size,
                       sha256=sha256_file(sdist))  # fmt: skip
    if attest_sdist:
        records.write(out, record.model_copy(update={"sdist": entry}))
        attest_passing_gates(out, wheels, state)
    else:
        records.write(out, record)  # the gates ran on the wheels alone
        attest_passing_gates(out, wheels, state)
        records.write(out, record.model_copy(update={"sdist": entry}))
    return Built(out, state, wheels, sdist)


def _release(step: str, built: Built) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "release", step, "--out", str(built.out), "--state-dir",
         str(built.state)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _packages(state: Path) -> dict[str, str]:
    folder = state / "index" / "packages"
    return {p.name: sha256_file(p) for p in folder.iterdir()} if folder.is_dir() else {}


def _consumer_verify(state: Path, work: Path) -> Verification:
    with EmbeddedIndex(state, USER) as index:
        return verify_release(
            index_url=index.simple_url, requirement="activekv==0.1.0",
            trusted_root=TufRepository(index.tuf_dir).trusted_root_path,
            provenance_key=key_paths(state, "dev")[1], interpreters=[Path(sys.executable)],
            imports=["activekv._probe"], workdir=work / "verify", cache_dir=work / "tuf-cache",
        )  # fmt: skip


def test_the_sdist_is_signed_published_and_verified_with_the_wheels(tmp_path: Path) -> None:
    built = _built(tmp_path)
    signed = _release("sign", built)
    assert signed.returncode == 0, signed.stdout + signed.stderr
    assert f"signed 3 wheel(s), the sdist {SDIST} and the 3 gate attestations" in signed.stdout
    sign = json.loads((built.out / "sign.json").read_text())
    expected = {w.name: sha256_file(w) for w in built.wheels} | {SDIST: sha256_file(built.sdist)}
    assert sign["subjects"] == expected

    published = _release("publish", built)
    assert published.returncode == 0, published.stdout + published.stderr
    record = json.loads((built.out / "publish.json").read_text())
    assert {f["file"]: f["sha256"] for f in record["files"]} == expected
    assert {f["outcome"] for f in record["files"]} == {"uploaded"}
    assert _packages(built.state) == expected  # the index holds these bytes
    assert SDIST in record["tuf"]["added"]

    verified = _consumer_verify(built.state, tmp_path)
    assert verified.files == expected  # every file served, the sdist included, checked
    again = _release("publish", built)
    assert again.returncode == 0 and "already exists on the index; nothing uploaded" in again.stdout


def test_an_sdist_changed_after_its_gates_is_not_signed(tmp_path: Path) -> None:
    built = _built(tmp_path)
    judged = sha256_file(built.sdist)
    with built.sdist.open("ab") as stream:
        stream.write(b"\0")
    refused = _release("sign", built)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    text = " ".join(refused.stderr.split())
    assert "channel 'dev' refuses to publish; nothing was uploaded: the sdist" in text
    assert f"(sha256 {sha256_file(built.sdist)}): expected a passing attestation" in text
    assert f"got payload judged {SDIST} sha256 {judged}" in text
    assert not (built.out / "sign.json").exists()


def test_an_sdist_no_passing_attestation_names_is_not_signed(tmp_path: Path) -> None:
    built = _built(tmp_path, attest_sdist=False)
    refused = _release("sign", built)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    text = " ".join(refused.stderr.split())
    assert "got none of policy, payload, casters judged an sdist" in text
    assert not (built.out / "sign.json").exists()


def test_a_published_sdist_is_never_replaced(tmp_path: Path) -> None:
    first = _built(tmp_path / "first")
    for step in ("sign", "publish"):
        done = _release(step, first)
        assert done.returncode == 0, done.stdout + done.stderr
    before = _packages(first.state)
    # The same version again, its sdist other bytes (another SOURCE_DATE_EPOCH), same wheels.
    second = _built(tmp_path / "second", epoch=EPOCH + 1)
    shutil.copytree(first.state, second.state, dirs_exist_ok=True)
    for wheel in second.wheels:
        assert sha256_file(wheel) == before[wheel.name]
    attest_passing_gates(second.out, second.wheels, second.state)  # with the state's dev key
    signed = _release("sign", second)
    assert signed.returncode == 0, signed.stdout + signed.stderr
    refused = _release("publish", second)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    text = " ".join(refused.stderr.split())
    assert f"this publish gives another set (other bytes: {SDIST}). Nothing was uploaded" in text
    assert _packages(second.state) == before


def test_the_consumer_refuses_an_sdist_no_gate_judged(tmp_path: Path) -> None:
    """A publisher that signs and publishes an sdist beside attestations that never judged it
    (publish() checks what the statement names, not what the gates judged): the consumer's
    verify refuses it, naming the sdist."""
    built = _built(tmp_path, attest_sdist=False)
    signer, key = load_signer("generate", channel="dev", state_dir=built.state)
    gates = load_manifest(DEFAULT_MANIFEST).channel("dev").requires
    read = {g: read_attestation(attestation_path(built.out, g), {key.keyid: key}, "the dev key")
            for g in gates}  # fmt: skip
    started = datetime.now(timezone.utc)
    statement = build_statement(
        built.wheels, sdist=built.sdist, version="0.1.0", channel="dev",
        manifest_path=Path("manifests/activekv.toml"), manifest_sha256="0" * 64,
        source_commit=None, source_date_epoch=EPOCH, toolchain={"python": "3"},
        started=started, finished=started + timedelta(seconds=1), gates=gates,
        attestations=[provenance_entry(a, catalogue.runner_of(g)) for g, a in read.items()],
    )  # fmt: skip
    envelope = built.out / "provenance" / "activekv-0.1.0.intoto.json"
    envelope.parent.mkdir(parents=True)
    write_envelope(sign_statement(statement, signer), envelope)
    with EmbeddedIndex(built.state, USER) as index:
        publish(built.wheels, index, envelope=envelope, metadata_dir=index.provenance_dir,
                tuf=TufRepository(index.tuf_dir), sdist=built.sdist,
                attachments={published_name(g): a.path for g, a in read.items()})  # fmt: skip
    with pytest.raises(VerifyError) as refused:
        _consumer_verify(built.state, tmp_path)
    message = str(refused.value)
    assert f"the signed statement names {SDIST} (sha256 {sha256_file(built.sdist)})" in message
    assert "which no attestation it rests on judged" in message


def test_an_sdist_of_another_release_is_refused_before_anything_is_uploaded(
    tmp_path: Path,
) -> None:
    built = _built(tmp_path)
    other = built.sdist.with_name("activekv-0.2.0.tar.gz")
    shutil.copyfile(built.sdist, other)
    with EmbeddedIndex(built.state, USER) as index, pytest.raises(PublishError) as refused:
        publish(built.wheels, index, envelope=tmp_path / "unused.intoto.json",
                metadata_dir=index.provenance_dir, sdist=other)  # fmt: skip
    assert str(refused.value) == (f"sdist {other}: expected one of the wheels' release, activekv "
                                  "0.1.0; got activekv 0.2.0. Nothing was uploaded")  # fmt: skip
    assert _packages(built.state) == {}
