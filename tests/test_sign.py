"""The sign step with real securesystemslib keys and DSSE envelopes."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from fixtures_wheels import build_wheel
from securesystemslib.signer import CryptoSigner

from release.errors import SigningError
from release.statement import (
    PAYLOAD_TYPE,
    STATEMENT_TYPE,
    read_statement_unverified,
    subject_digests,
)
from release.trust.sign import (
    PREDICATE_TYPE,
    build_statement,
    key_paths,
    load_public_key,
    load_signer,
    read_and_verify_envelope,
    sign_statement,
    write_envelope,
    write_public_key,
)

STARTED = datetime(2026, 12, 2, 10, 0, 0, tzinfo=timezone.utc)


def _statement(wheels: list[Path], tmp_path: Path, commit: str | None = "a" * 40) -> dict:
    manifest = tmp_path / "manifests" / "activekv.toml"
    manifest.parent.mkdir(exist_ok=True)
    manifest.write_text("schema_version = 1\n")
    return build_statement(
        wheels,
        version="0.1.0",
        channel="dev",
        manifest_path=manifest,
        manifest_sha256=hashlib.sha256(manifest.read_bytes()).hexdigest(),
        source_commit=commit,
        source_date_epoch=1_700_000_000,
        toolchain={"python": "3.11.7", "zig": "0.17.1"},
        started=STARTED,
        finished=STARTED + timedelta(minutes=3),
    )


def _pem_file(path: Path, mode: int) -> tuple[Path, str]:
    pem = (
        Ed25519PrivateKey.generate()
        .private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        .decode()
    )
    path.write_text(pem)
    os.chmod(path, mode)
    return path, pem


def _secret_body(pem_text: str) -> str:
    """The base64 body of a PEM, the part that is the secret."""
    return "".join(line for line in pem_text.splitlines() if not line.startswith("-----"))


# ----------------------------------------------------------------------------- keys


def test_generate_writes_private_key_0600_and_public_key(tmp_path: Path) -> None:
    signer, key = load_signer("generate", channel="dev", state_dir=tmp_path)
    pem_path, pub_path = key_paths(tmp_path, "dev")
    assert pem_path == tmp_path / "keys" / "dev-signing-key.pem"
    assert stat.S_IMODE(pem_path.stat().st_mode) == 0o600
    assert pem_path.read_text().startswith("-----BEGIN PRIVATE KEY-----")

    document = json.loads(pub_path.read_text())
    assert document["keyid"] == key.keyid
    assert document["keytype"] == "ed25519"
    assert load_public_key(pub_path) == key
    assert signer.public_key == key


def test_generate_reuses_the_key_on_second_call(tmp_path: Path) -> None:
    _, first = load_signer("generate", channel="dev", state_dir=tmp_path)
    pem_before = key_paths(tmp_path, "dev")[0].read_bytes()
    signer, second = load_signer("generate", channel="dev", state_dir=tmp_path)
    assert second.keyid == first.keyid
    assert key_paths(tmp_path, "dev")[0].read_bytes() == pem_before
    # and the reloaded signer really signs for the first key
    envelope = sign_statement({"_type": STATEMENT_TYPE, "subject": []}, signer)
    path = tmp_path / "e.json"
    write_envelope(envelope, path)
    assert read_and_verify_envelope(path, first)["subject"] == []


def test_generate_is_refused_for_stable(tmp_path: Path) -> None:
    with pytest.raises(SigningError, match="dev keys can never sign for stable"):
        load_signer("generate", channel="stable", state_dir=tmp_path)
    assert not (tmp_path / "keys").exists()


def test_generate_refuses_public_key_without_its_private_key(tmp_path: Path) -> None:
    load_signer("generate", channel="dev", state_dir=tmp_path)
    pem_path, _ = key_paths(tmp_path, "dev")
    pem_path.unlink()
    with pytest.raises(SigningError, match=r"dev-signing-key\.pub\.json exists"):
        load_signer("generate", channel="dev", state_dir=tmp_path)


def test_file_key_with_0600_loads(tmp_path: Path) -> None:
    path, _ = _pem_file(tmp_path / "stable.pem", 0o600)
    signer, key = load_signer(f"file:{path}", channel="stable", state_dir=tmp_path)
    assert key.keytype == "ed25519"
    assert signer.public_key == key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o700, 0o400])
def test_file_key_with_other_mode_is_refused_naming_path_and_mode(
    tmp_path: Path, mode: int
) -> None:
    path, pem = _pem_file(tmp_path / "stable.pem", mode)
    with pytest.raises(SigningError) as caught:
        load_signer(f"file:{path}", channel="stable", state_dir=tmp_path)
    message = str(caught.value)
    assert str(path) in message
    assert f"{mode:04o}" in message
    assert f"signing key {path} has mode {mode:04o}; it must be 0600" in message
    assert _secret_body(pem) not in message


def test_file_key_missing_or_relative_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SigningError, match="does not exist"):
        load_signer(f"file:{tmp_path}/absent.pem", channel="stable", state_dir=tmp_path)
    with pytest.raises(SigningError, match="must be absolute"):
        load_signer("file:relative/key.pem", channel="stable", state_dir=tmp_path)


def test_file_key_that_is_not_a_key_is_refused_without_echoing_it(tmp_path: Path) -> None:
    path = tmp_path / "garbage.pem"
    secret = "-----BEGIN PRIVATE KEY-----\nTk9UQUtFWVNFQ1JFVFRFWFQ=\n-----END PRIVATE KEY-----\n"
    path.write_text(secret)
    os.chmod(path, 0o600)
    with pytest.raises(SigningError) as caught:
        load_signer(f"file:{path}", channel="stable", state_dir=tmp_path)
    assert str(path) in str(caught.value)
    assert "Tk9UQUtFWVNFQ1JFVFRFWFQ" not in str(caught.value)


@pytest.mark.parametrize("ref", ["vault:transit/keys/x", "kms:alias/activekv", "s3:bucket/k"])
def test_schemes_securesystemslib_does_not_know_are_refused_naming_the_supported(
    tmp_path: Path, ref: str
) -> None:
    scheme = ref.split(":")[0]
    with pytest.raises(SigningError, match=f"scheme '{scheme}' is not supported") as caught:
        load_signer(ref, channel="stable", state_dir=tmp_path)
    assert ref in str(caught.value)
    assert "file2, gcpkms" in str(caught.value)


def _file2_key(tmp_path: Path, mode: int = 0o600) -> tuple[str, Path, str]:
    """A ``file2:`` signer URI (securesystemslib's CryptoSigner), its public key file, its PEM."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path, pem = _pem_file(tmp_path / "uri-key.pem", mode)
    public = tmp_path / "uri-key.pub.json"
    write_public_key(CryptoSigner.from_priv_key_uri(f"file2:{path}", _public_of(pem)).public_key,
                     public)  # fmt: skip
    os.chmod(path, mode)
    return f"file2:{path}", public, pem


def _public_of(pem: str):  # the SSlibKey of a PEM private key
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(load_pem_private_key(pem.encode(), password=None).public_key())


def test_signer_uri_loads_through_securesystemslib_and_signs_for_stable(tmp_path: Path) -> None:
    uri, public, _ = _file2_key(tmp_path)
    signer, key = load_signer(uri, channel="stable", state_dir=tmp_path, public_key=public)
    assert key == load_public_key(public)
    envelope = tmp_path / "e.json"
    wheel = build_wheel(tmp_path / "dist")
    write_envelope(sign_statement(_statement([wheel], tmp_path), signer), envelope)
    assert subject_digests(read_and_verify_envelope(envelope, key)) == {
        wheel.name: hashlib.sha256(wheel.read_bytes()).hexdigest()
    }


def test_signer_uri_without_its_public_key_is_refused(tmp_path: Path) -> None:
    uri, _, _ = _file2_key(tmp_path)
    with pytest.raises(SigningError, match=r"a signer URI needs the signer's public key"):
        load_signer(uri, channel="stable", state_dir=tmp_path)


def test_signer_uri_with_another_public_key_is_refused(tmp_path: Path) -> None:
    uri, _, _ = _file2_key(tmp_path)
    _, other_public, _ = _file2_key(tmp_path / "other")
    with pytest.raises(SigningError, match=r"cannot load this signer .*does not match") as caught:
        load_signer(uri, channel="stable", state_dir=tmp_path, public_key=other_public)
    assert "PRIVATE KEY" not in str(caught.value)


def test_file2_signer_uri_key_file_must_be_0600(tmp_path: Path) -> None:
    uri, public, _ = _file2_key(tmp_path, mode=0o644)
    with pytest.raises(SigningError, match=r"has mode 0644; it must be 0600"):
        load_signer(uri, channel="stable", state_dir=tmp_path, public_key=public)


def test_kms_signer_uri_reports_a_clear_error_where_its_library_is_missing(
    tmp_path: Path,
) -> None:
    _, public, _ = _file2_key(tmp_path)
    with pytest.raises(SigningError, match=r"key reference 'awskms:alias/activekv'"):
        load_signer("awskms:alias/activekv", channel="stable", state_dir=tmp_path,
                    public_key=public)  # fmt: skip


# ----------------------------------------------------------------------------- statement


def test_statement_subjects_match_wheel_digests(tmp_path: Path) -> None:
    wheels = [
        build_wheel(tmp_path / "dist", version="0.1.0"),
        build_wheel(tmp_path / "dist", version="0.1.0", tag="py3-none-manylinux_2_17_x86_64"),
    ]
    statement = _statement(wheels, tmp_path)
    assert statement["_type"] == STATEMENT_TYPE
    assert statement["predicateType"] == PREDICATE_TYPE
    assert subject_digests(statement) == {
        w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels
    }

    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["channel"] == "dev"
    assert definition["externalParameters"]["version"] == "0.1.0"
    assert definition["internalParameters"]["source_date_epoch"] == 1_700_000_000
    assert definition["internalParameters"]["toolchain"]["zig"] == "0.17.1"
    [dependency] = definition["resolvedDependencies"]
    assert dependency["digest"] == {"gitCommit": "a" * 40}
    assert dependency["uri"].startswith("git+file://")

    metadata = statement["predicate"]["runDetails"]["metadata"]
    assert metadata["startedOn"] == "2026-12-02T10:00:00Z"
    assert metadata["finishedOn"] == "2026-12-02T10:03:00Z"
    assert len(metadata["invocationId"]) == 36


def test_statement_without_commit_has_no_dependency_and_needs_aware_times(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    statement = _statement([wheel], tmp_path, commit=None)
    assert statement["predicate"]["buildDefinition"]["resolvedDependencies"] == []
    with pytest.raises(SigningError, match="timezone-aware"):
        build_statement(
            [wheel],
            version="0.1.0",
            channel="dev",
            manifest_path=tmp_path / "m.toml",
            manifest_sha256="0" * 64,
            source_commit=None,
            source_date_epoch=0,
            toolchain={},
            started=datetime(2026, 1, 1),
            finished=datetime(2026, 1, 1),
        )


# ----------------------------------------------------------------------------- envelope


def test_sign_then_verify_round_trip(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    statement = _statement([wheel], tmp_path)
    signer, key = load_signer("generate", channel="dev", state_dir=tmp_path)
    envelope = sign_statement(statement, signer)
    assert envelope.payload_type == PAYLOAD_TYPE
    path = tmp_path / "out" / "activekv-0.1.0.intoto.json"
    write_envelope(envelope, path)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind
    assert read_and_verify_envelope(path, key) == statement
    assert read_statement_unverified(path) == statement


def test_tampered_payload_fails(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    statement = _statement([wheel], tmp_path)
    signer, key = load_signer("generate", channel="dev", state_dir=tmp_path)
    path = tmp_path / "e.json"
    write_envelope(sign_statement(statement, signer), path)

    document = json.loads(path.read_text())
    forged = dict(statement)
    forged["subject"] = [{"name": wheel.name, "digest": {"sha256": "0" * 64}}]
    document["payload"] = base64.b64encode(json.dumps(forged).encode()).decode()
    path.write_text(json.dumps(document))
    with pytest.raises(SigningError, match="does not verify") as caught:
        read_and_verify_envelope(path, key)
    assert str(path) in str(caught.value)


def test_a_different_key_fails(tmp_path: Path) -> None:
    statement = _statement([build_wheel(tmp_path / "dist")], tmp_path)
    signer, _ = load_signer("generate", channel="dev", state_dir=tmp_path / "a")
    _, other = load_signer("generate", channel="dev", state_dir=tmp_path / "b")
    path = tmp_path / "e.json"
    write_envelope(sign_statement(statement, signer), path)
    with pytest.raises(SigningError, match="not by the expected key") as caught:
        read_and_verify_envelope(path, other)
    assert str(path) in str(caught.value)


def test_a_different_key_claiming_the_right_keyid_fails(tmp_path: Path) -> None:
    statement = _statement([build_wheel(tmp_path / "dist")], tmp_path)
    _, key = load_signer("generate", channel="dev", state_dir=tmp_path)
    impostor = CryptoSigner.generate_ed25519(keyid=key.keyid)
    path = tmp_path / "e.json"
    write_envelope(sign_statement(statement, impostor), path)
    with pytest.raises(SigningError, match="does not verify"):
        read_and_verify_envelope(path, key)


def test_missing_signature_wrong_type_and_bad_json_fail_naming_the_file(tmp_path: Path) -> None:
    statement = _statement([build_wheel(tmp_path / "dist")], tmp_path)
    signer, key = load_signer("generate", channel="dev", state_dir=tmp_path)
    path = tmp_path / "e.json"
    write_envelope(sign_statement(statement, signer), path)
    good = json.loads(path.read_text())

    path.write_text(json.dumps({**good, "signatures": []}))
    with pytest.raises(SigningError, match="no signature"):
        read_and_verify_envelope(path, key)

    path.write_text(json.dumps({**good, "payloadType": "application/json"}))
    with pytest.raises(SigningError, match="payload type"):
        read_and_verify_envelope(path, key)

    path.write_text("{not json")
    with pytest.raises(SigningError, match="not JSON") as caught:
        read_and_verify_envelope(path, key)
    assert str(path) in str(caught.value)

    path.write_text(json.dumps({"payload": good["payload"]}))
    with pytest.raises(SigningError, match="not a DSSE envelope"):
        read_and_verify_envelope(path, key)

    with pytest.raises(SigningError, match="cannot read"):
        read_and_verify_envelope(tmp_path / "absent.json", key)


def test_private_key_never_leaves_the_key_file(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    signer, key = load_signer("generate", channel="dev", state_dir=tmp_path)
    pem_path, pub_path = key_paths(tmp_path, "dev")
    pem_text = pem_path.read_text()
    body = _secret_body(pem_text)
    # the raw 32-byte seed too, in the encodings a leak would use
    private = signer._private_key  # type: ignore[attr-defined]
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    secrets = {body, seed.hex(), base64.b64encode(seed).decode()}

    envelope_path = tmp_path / "e.json"
    write_envelope(sign_statement(_statement([wheel], tmp_path), signer), envelope_path)
    exported = tmp_path / "exported.pub.json"
    write_public_key(key, exported)
    texts = {
        "envelope": envelope_path.read_text(),
        "pub.json": pub_path.read_text(),
        "exported": exported.read_text(),
    }

    # exception messages about the key: wrong mode, and a failed verification
    os.chmod(pem_path, 0o644)
    with pytest.raises(SigningError) as mode_error:
        load_signer("generate", channel="dev", state_dir=tmp_path)
    texts["mode error"] = str(mode_error.value)
    os.chmod(pem_path, 0o600)
    envelope_path.write_text(envelope_path.read_text().replace('"sig": "', '"sig": "AA'))
    with pytest.raises(SigningError) as verify_error:
        read_and_verify_envelope(envelope_path, key)
    texts["verify error"] = str(verify_error.value)

    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"private key material in {where}"
        assert "PRIVATE KEY" not in text, where


# ----------------------------------------------------------------------------- malformed JSON

_BOM = b"\xef\xbb\xbf"


def _signed_envelope(tmp_path: Path, payload: bytes) -> tuple[Path, CryptoSigner]:
    signer = CryptoSigner.generate_ed25519()
    envelope = sign_statement({"_type": STATEMENT_TYPE, "subject": []}, signer)
    envelope.payload = payload
    envelope.signatures.clear()
    envelope.sign(signer)
    path = tmp_path / "statement.intoto.json"
    write_envelope(envelope, path)
    return path, signer


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("file", r"the envelope is not JSON \(expected JSON text; got a UTF-8 byte-order mark"),
        ("payload", r"the payload is not JSON \(expected JSON text; got a UTF-8 byte-order mark"),
        ("deep", r"the payload is not JSON \(expected JSON; got values nested deeper"),
        ("nan", r"the payload is not JSON \(expected JSON numbers; got NaN"),
    ],
)
def test_a_statement_that_is_not_plain_json_is_one_signing_error(tmp_path, where, said):
    body = json.dumps({"_type": STATEMENT_TYPE, "subject": []}).encode()
    payload = {"payload": _BOM + body, "deep": b"[" * 100_000 + b"]" * 100_000,
               "nan": b'{"_type": NaN}'}.get(where, body)  # fmt: skip
    path, signer = _signed_envelope(tmp_path, payload)
    if where == "file":
        path.write_bytes(_BOM + path.read_bytes())
    for read in (
        read_statement_unverified,
        lambda p: read_and_verify_envelope(p, signer.public_key),
    ):
        with pytest.raises(SigningError, match=rf"{path}: {said}"):
            read(path)


def test_a_public_key_file_with_a_bom_or_deep_nesting_is_one_signing_error(tmp_path):
    path = tmp_path / "k.pub.json"
    for data, said in ((_BOM + b"{}", "byte-order mark"), (b"[" * 100_000, "nested deeper")):
        path.write_bytes(data)
        with pytest.raises(SigningError, match=rf"{path}: not a readable public key file .*{said}"):
            load_public_key(path)
