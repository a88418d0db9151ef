"""Sign step: load a signing key, build an in-toto v1 Statement with a SLSA v1 provenance
predicate over the wheels, wrap it in a DSSE envelope and verify such envelopes.

Key references (manifest ``[sign.<channel>].key``):

* ``generate`` -- a dev key, generated on first use into ``<state_dir>/keys/`` and reused after;
  refused for the ``stable`` channel.
* ``file:/abs/path.pem`` -- a PEM private key file that only its owner may read (mode 0600).
* ``<scheme>:...`` -- any private key URI securesystemslib supports (``SIGNER_FOR_URI_SCHEME``:
  ``file2:``, ``gcpkms:``, ``awskms:``, ``azurekms:``, ``hv:``, ``hsm:``, ...), loaded through
  ``Signer.from_priv_key_uri`` with the signer's public key (``[sign.<name>].public_key``, a file
  written by :func:`write_public_key`). A ``file2:`` key file must have mode 0600 too.

Private key material never appears in a message, a log or an output file of this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import FormatError, UnverifiedSignatureError
from securesystemslib.signer import SIGNER_FOR_URI_SCHEME, CryptoSigner, Key, Signer

from release.errors import SigningError
from release.statement import (
    PAYLOAD_TYPE,
    STATEMENT_TYPE,
    SignedStatement,
    decode_statement,
    read_envelope_bytes,
)
from release.util.atomic import atomic_write
from release.util.digests import sha256_file
from release.util.jsonfile import read_json

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/activekv/release/build/v1"
BUILDER_ID = "https://github.com/activekv/release/builder/local/v1"

GENERATE = "generate"
_FILE_SCHEME = "file:"
_PROTECTED_CHANNEL = "stable"
_PRIVATE_MODE = 0o600


class UnlistedSignerError(SigningError):
    """An envelope whose signatures are by keys other than the ones that count."""


# --------------------------------------------------------------------------- keys


def signing_key_name(channel: str) -> str:
    """The file name, without suffix, of ``channel``'s signing key (generated, made by keygen,
    or its public key beside the statement)."""
    return f"{channel}-signing-key"


def key_paths(state_dir: Path, channel: str) -> tuple[Path, Path]:
    """Where a generated key of ``channel`` lives: (private PEM, public JSON)."""
    keys, name = state_dir / "keys", signing_key_name(channel)
    return keys / f"{name}.pem", keys / f"{name}.pub.json"


def load_signer(
    key_ref: str, *, channel: str, state_dir: Path, public_key: Path | None = None
) -> tuple[Signer, Key]:
    """The signer named by ``key_ref`` for ``channel`` and its public key.

    ``public_key`` (a file of :func:`write_public_key`) is needed by signer URIs only."""
    if key_ref == GENERATE:
        if channel == _PROTECTED_CHANNEL:
            raise SigningError(
                f"key reference {GENERATE!r} is refused for channel {channel!r}: "
                "dev keys can never sign for stable; give a file: key or a signer URI"
            )
        return _generated_signer(state_dir, channel)
    if is_file_key(key_ref):
        signer = _signer_from_pem_file(file_key_path(key_ref))
        return signer, signer.public_key
    scheme = key_ref.partition(":")[0] if ":" in key_ref else key_ref
    if ":" in key_ref and scheme in SIGNER_FOR_URI_SCHEME:
        return _uri_signer(key_ref, scheme, public_key)
    raise SigningError(
        f"key reference {key_ref!r}: signer URI scheme {scheme!r} is not supported "
        f"(supported: {GENERATE!r} for dev channels, 'file:/abs/path.pem', or a securesystemslib "
        f"signer URI with scheme {', '.join(sorted(SIGNER_FOR_URI_SCHEME))})"
    )


def _uri_signer(key_ref: str, scheme: str, public_key_path: Path | None) -> tuple[Signer, Key]:
    if public_key_path is None:
        raise SigningError(
            f"key reference {key_ref!r}: a signer URI needs the signer's public key; give "
            "[sign.<name>].public_key, the path of a *.pub.json public key file"
        )
    public_key = load_public_key(public_key_path)
    if scheme == CryptoSigner.SCHEME and not os.environ.get(CryptoSigner.PREFIX_ENV_VAR):
        _check_private_file(Path(key_ref.partition(":")[2]))
    try:
        signer = Signer.from_priv_key_uri(key_ref, public_key)
    except OSError as exc:
        raise SigningError(
            f"key reference {key_ref!r}: the key cannot be read ({exc.strerror})"
        ) from None
    except Exception as exc:  # each signer library raises its own types
        # Only the type is shown: a parser's text could echo key material.
        raise SigningError(
            f"key reference {key_ref!r}: securesystemslib cannot load this signer with the public "
            f"key {public_key_path} ({type(exc).__name__}: the key does not match, or the URI "
            "is malformed)"
        ) from None
    return signer, public_key


def refuse_writable_by_others(path: Path, what: str) -> None:
    """SigningError when group or others may write ``path`` (a key file, or the folder holding
    one): whoever can write it can put their own key in its place."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return  # a missing file is reported by whoever reads it
    if mode & 0o022:
        raise SigningError(
            f"{what} {path} has mode {mode:04o}: group or others may write it, and so replace a "
            f"key; chmod go-w {path}"
        )


def load_public_key(path: Path) -> Key:
    """A public key written by :func:`write_public_key` (``Key.to_dict()`` plus ``keyid``)."""
    refuse_writable_by_others(path, "public key")
    try:
        data = read_json(path)
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        keyid = data.pop("keyid")
        return Key.from_dict(keyid, data)
    except (OSError, ValueError, TypeError, KeyError, FormatError) as exc:
        raise SigningError(f"{path}: not a readable public key file ({exc})") from None


def write_public_key(key: Key, path: Path) -> None:
    """Write ``key`` (public part only) as JSON, atomically."""
    document = {"keyid": key.keyid, **key.to_dict()}
    atomic_write(path, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())


def _generated_signer(state_dir: Path, channel: str) -> tuple[Signer, Key]:
    return generated_key_pair(*key_paths(state_dir, channel))


def generated_key_pair(pem_path: Path, pub_path: Path) -> tuple[Signer, Key]:
    """An ed25519 key kept at ``pem_path`` (mode 0600) and ``pub_path``; generated on first use."""
    pem_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not pem_path.exists():
        if pub_path.exists():
            raise SigningError(
                f"{pub_path} exists but its private key {pem_path} does not; restore the "
                "private key, or remove the public key to generate a new pair"
            )
        generated = CryptoSigner.generate_ed25519()
        try:
            fd = os.open(pem_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, _PRIVATE_MODE)
        except FileExistsError:
            pass  # another run generated it first: load theirs below
        else:
            try:
                os.fchmod(fd, _PRIVATE_MODE)  # whatever the umask
                with os.fdopen(fd, "wb") as stream:
                    stream.write(generated.private_bytes)
                    stream.flush()
                    os.fsync(stream.fileno())
            except OSError as error:  # a full disk: no partial key is left to be loaded later
                pem_path.unlink(missing_ok=True)
                raise SigningError(f"{pem_path}: cannot write the generated key "
                                   f"({error.strerror or error})") from None  # fmt: skip
            write_public_key(generated.public_key, pub_path)
    signer = _signer_from_pem_file(pem_path)
    key = signer.public_key
    if not pub_path.exists():
        write_public_key(key, pub_path)
    elif load_public_key(pub_path) != key:
        raise SigningError(f"{pub_path} does not hold the public key of {pem_path}")
    return signer, key


def is_file_key(key_ref: str) -> bool:
    """Whether ``key_ref`` names a PEM file (``file:<absolute path>``)."""
    return key_ref.startswith(_FILE_SCHEME)


def file_key_path(key_ref: str) -> Path:
    """The PEM file a ``file:`` key reference names (``file:/abs`` or ``file:///abs``)."""
    raw = key_ref[len(_FILE_SCHEME) :]
    if raw.startswith("//"):  # file:///abs/path form
        raw = raw[2:]
        if not raw.startswith("/"):
            raise SigningError(f"key reference {key_ref!r}: only local file: URIs are supported")
    path = Path(raw)
    if not path.is_absolute():
        raise SigningError(f"key reference {key_ref!r}: the key path must be absolute")
    return path


def _signer_from_pem_file(path: Path) -> CryptoSigner:
    _check_private_file(path)
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise SigningError(f"signing key {path} cannot be read: {exc.strerror}") from None
    try:
        private_key = load_pem_private_key(pem, password=None)
        return CryptoSigner(private_key)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        # The exception text of a parser is kept out: it could echo the input.
        raise SigningError(
            f"signing key {path} is not an unencrypted PEM private key of a supported type "
            f"({type(exc).__name__})"
        ) from None


def _check_private_file(path: Path) -> None:
    """``path`` is a regular file only its owner may read and write (mode 0600), in a folder
    that group and others may not write."""
    refuse_writable_by_others(path.parent, "the folder of signing key")
    try:
        info = path.stat()
    except FileNotFoundError:
        raise SigningError(f"signing key {path} does not exist") from None
    except OSError as exc:
        raise SigningError(f"signing key {path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SigningError(f"signing key {path} is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode != _PRIVATE_MODE:
        raise SigningError(
            f"signing key {path} has mode {mode:04o}; it must be 0600 "
            f"(readable and writable by its owner only): chmod 600 {path}"
        )


# --------------------------------------------------------------------------- statement


def build_statement(
    wheels: Sequence[Path],
    *,
    version: str,
    channel: str,
    manifest_path: Path,
    manifest_sha256: str,
    source_commit: str | None,
    source_date_epoch: int,
    toolchain: Mapping[str, str],
    started: datetime,
    finished: datetime,
    source_uri: str | None = None,
    source_annotations: Mapping[str, Any] | None = None,
    builder_id: str = BUILDER_ID,
    digests: Mapping[str, str] | None = None,
    gates: Sequence[str] = (),
    attestations: Sequence[Mapping[str, Any]] = (),
    sdist: Path | None = None,
) -> dict[str, Any]:
    """An in-toto v1 Statement with a SLSA v1 provenance predicate naming every wheel, and the
    sdist built beside them (``sdist``) when there is one: each file is a subject.

    ``source_uri`` defaults to ``git+file://<repository holding the manifest>``;
    ``source_annotations`` say how the tree differed from ``source_commit`` (uncommitted
    changes: release/source_state.py). ``digests``
    (file name to sha256) are the build's; without them each file is hashed here.
    ``gates`` are the gates the channel requires, ``attestations`` the signed gate attestations
    the release rests on (``release.trust.attestation.provenance_entry``), as byproducts.
    """
    if not wheels:
        raise SigningError("nothing to sign: no wheels given")
    subjects: dict[str, str] = {}
    files = [("wheel", wheel) for wheel in wheels]
    if sdist is not None:
        files.append(("sdist", sdist))
    for what, path in files:
        if path.name in subjects:
            raise SigningError(f"file name {path.name} is given twice ({path})")
        if digests is not None and path.name in digests:
            subjects[path.name] = digests[path.name]
            continue
        try:
            subjects[path.name] = sha256_file(path)
        except OSError as exc:
            raise SigningError(f"{what} {path} cannot be read: {exc.strerror}") from None
    resolved: list[dict[str, Any]] = []
    if source_commit:
        source: dict[str, Any] = {
            "uri": source_uri or _default_source_uri(manifest_path),
            "digest": {"gitCommit": source_commit},
        }
        if source_annotations:
            source["annotations"] = dict(source_annotations)
        resolved.append(source)
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": digest}}
            for name, digest in sorted(subjects.items())
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "manifest": {
                        "path": manifest_path.as_posix(),
                        "digest": {"sha256": manifest_sha256},
                    },
                    "channel": channel,
                    "version": version,
                    "gates": list(gates),
                },
                "internalParameters": {
                    "source_date_epoch": source_date_epoch,
                    "toolchain": dict(sorted(toolchain.items())),
                },
                "resolvedDependencies": resolved,
            },
            "runDetails": {
                "builder": {"id": builder_id},
                "metadata": {
                    "invocationId": str(uuid.uuid4()),
                    "startedOn": _rfc3339(started, "started"),
                    "finishedOn": _rfc3339(finished, "finished"),
                },
                "byproducts": [dict(entry) for entry in attestations],
            },
        },
    }


def _rfc3339(moment: datetime, what: str) -> str:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise SigningError(f"{what} time {moment.isoformat()} must be timezone-aware")
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _default_source_uri(manifest_path: Path) -> str:
    start = manifest_path.resolve().parent
    for candidate in (start, *start.parents):
        if (candidate / ".git").exists():
            return f"git+file://{candidate.as_posix()}"
    return f"git+file://{start.as_posix()}"


# --------------------------------------------------------------------------- envelope


def sign_statement(statement: Mapping[str, Any], signer: Signer) -> Envelope:
    """A DSSE envelope over the canonical JSON of ``statement``, signed by ``signer``."""
    payload = json.dumps(dict(statement), sort_keys=True, separators=(",", ":")).encode("utf-8")
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    return envelope


def write_envelope(envelope: Envelope, path: Path) -> None:
    """Write ``envelope`` as JSON, atomically (a reader sees the old file or the new one)."""
    text = json.dumps(envelope.to_dict(), indent=2, sort_keys=True) + "\n"
    atomic_write(path, text.encode("utf-8"))


def sign_to(statement: Mapping[str, Any], signer: Signer, path: Path) -> None:
    """Sign ``statement`` with ``signer`` and write its envelope at ``path`` (atomically)."""
    write_envelope(sign_statement(statement, signer), path)


def read_and_verify_envelope(path: Path, public_key: Key) -> dict[str, Any]:
    """The statement of the DSSE envelope at ``path`` as a plain document (a copy to change),
    after its signature by ``public_key`` verified; the pipeline takes :func:`read_and_verify`."""
    return dict(read_and_verify(path, public_key).statement.raw)


def read_and_verify(path: Path, public_key: Key) -> SignedStatement:
    """The envelope at ``path`` as a signed statement, after its signature by ``public_key``
    verified: read and checked once, then passed along."""
    return read_and_verify_by_any(path, {public_key.keyid: public_key}, "the expected key")


def read_and_verify_by_any(path: Path, trusted: Mapping[str, Key], listed: str) -> SignedStatement:
    """The statement of the envelope at ``path``, the sha256 of the bytes read and the key that
    signed it, after that key's signature verified; ``trusted`` maps keyid to key, ``listed``
    says in messages where those keys come from. SigningError for an unsigned envelope, one
    signed by no trusted key, or one whose signature does not verify (the payload or the
    signature was altered)."""
    return verify_read(path, *read_envelope_bytes(path), trusted, listed)


def verify_read(
    path: Path, envelope: Envelope, raw: bytes, trusted: Mapping[str, Key], listed: str
) -> SignedStatement:
    """:func:`read_and_verify_by_any` of an envelope already read from ``path`` (as ``raw``):
    the bytes that were looked at are the bytes whose signature is checked."""
    if not envelope.signatures:
        raise SigningError(f"{path}: the envelope has no signature")
    signers = [keyid for keyid in sorted(envelope.signatures) if keyid in trusted]
    if not signers:
        known = ", ".join(sorted(trusted)) or "none"
        raise UnlistedSignerError(
            f"{path}: signed by key(s) {', '.join(sorted(envelope.signatures))}, "
            f"not by {listed} ({known})"
        )
    key = trusted[signers[0]]
    try:
        envelope.verify([key], 1)
    except UnverifiedSignatureError:
        raise SigningError(
            f"{path}: the signature of key {key.keyid} does not verify "
            "(the payload or the signature was altered)"
        ) from None
    return SignedStatement(
        decode_statement(path, envelope), path, hashlib.sha256(raw).hexdigest(), key
    )


# --------------------------------------------------------------------------- files
