"""Gate attestations: each gate run's evidence as an in-toto Statement, DSSE-signed by its runner.

A gate run writes ``<out>/evidence/<gate>.intoto.json``: an in-toto v1 Statement whose subjects
are the judged wheels (file name and sha256) and whose predicate (``GATE_PREDICATE_TYPE``) is the
evidence record (gate, verdict, reason, figures, runner, tool versions, time), in a DSSE envelope
signed by the runner's key: a GPU runner's own key, or on the release job the channel's signing
key.

A channel takes, for each gate it requires, an attestation that is signed by a key the manifest
lists for the gate's runner class on that channel (``[release.channels.<name>].attesters``), says
pass, and names exactly the digests being published; from ``<out>/evidence/`` or the channel's
committed folders (``attestations``). An envelope with no signature, or whose signature does not
verify, refuses the publish by itself, naming the file: it was altered.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.signer import Key, Signer

from release.errors import SigningError
from release.evidence import Evidence
from release.statement import (
    SUFFIX,
    SignedStatement,
    Statement,
    decode_statement,
    gate_evidence,
    gate_statement,
    other_wheels,
    read_envelope_bytes,
)
from release.trust.release_version import attestation_target
from release.trust.sign import (
    UnlistedSignerError,
    read_and_verify_by_any,
    sign_to,
    verify_read,
)
from release.util.digests import sha256_file


def published_name(gate: str) -> str:
    """The file name of a gate's attestation, in <out>/evidence/ and where a release keeps it."""
    return f"{gate}{SUFFIX}"


def attestation_path(out_dir: Path, gate: str) -> Path:
    return out_dir / "evidence" / published_name(gate)


def attest(evidence: Evidence, signer: Signer, out_dir: Path) -> Path:
    """Signs `evidence` with the runner's `signer`; the envelope's path."""
    path = attestation_path(out_dir, evidence.gate)
    path.parent.mkdir(parents=True, exist_ok=True)
    sign_to(gate_statement(evidence), signer, path)
    return path


@dataclass(frozen=True)
class Attestation:
    path: Path
    sha256: str  # of the envelope file: the provenance names it by this
    key: Key  # the key whose signature verified
    evidence: Evidence


def read_attestation(path: Path, trusted: Mapping[str, Key], listed: str) -> Attestation:
    """The attestation at `path`, its signature verified by one of `trusted` (keyid to key;
    `listed` says where they are listed). SigningError names the file and what is wrong."""
    return _attestation(read_and_verify_by_any(path, trusted, listed))


def _attestation(signed: SignedStatement) -> Attestation:
    # The digest of the very bytes that verified: the provenance names the attestation by it.
    path = signed.path
    return Attestation(path, signed.sha256, signed.key, gate_evidence(path, signed.statement))


@dataclass(frozen=True)
class GateKeys:
    """For one gate: the keys whose attestations count and where the manifest lists them."""

    gate: str
    keys: Mapping[str, Key]
    listed: str


def choose(
    gates: Sequence[GateKeys], folders: Sequence[Path], digests: Mapping[str, str]
) -> tuple[dict[str, Attestation], list[str]]:
    """For each gate, an attestation by one of its keys that passed on exactly `digests`; and,
    for each gate without one, why each candidate was not taken. An altered, unsigned or
    unreadable candidate raises SigningError at once: nothing it could say is taken."""
    # Each candidate is read once: the bytes sorted by gate are the bytes whose signature counts.
    candidates: dict[str, list[tuple[Path, Envelope, bytes]]] = {g.gate: [] for g in gates}
    for folder in folders:
        for path in sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else ():
            envelope, raw = read_envelope_bytes(path)
            gate = decode_statement(path, envelope).gate
            if gate in candidates:
                candidates[gate].append((path, envelope, raw))
    chosen: dict[str, Attestation] = {}
    problems: list[str] = []
    for spec in gates:
        reasons: list[str] = []
        for path, envelope, raw in candidates[spec.gate]:
            try:
                signed = verify_read(path, envelope, raw, spec.keys, spec.listed)
                attestation = _attestation(signed)
            except UnlistedSignerError as error:  # signed, but by a key that does not count
                reasons.append(str(error))
                continue
            reason = _unusable(attestation.evidence, digests)
            if reason is None:
                chosen[spec.gate] = attestation
                break
            reasons.append(f"{path}: {reason}")
        if spec.gate not in chosen:
            where = ", ".join(str(folder) for folder in folders)
            if not reasons:
                problems.append(f"{spec.gate}: no attestation in {where}")
                continue
            problems.append(f"{spec.gate}: no attestation in {where} passes on the wheels being "
                            "published" + "".join(f"\n    {r}" for r in reasons))  # fmt: skip
    return chosen, problems


def _unusable(evidence: Evidence, digests: Mapping[str, str]) -> str | None:
    if evidence.verdict != "pass":
        detail = f" ({evidence.reason})" if evidence.reason else ""
        return f"verdict is {evidence.verdict}{detail}"
    return other_wheels(evidence.artefacts, digests)


def provenance_entry(attestation: Attestation, runner: str) -> dict[str, Any]:
    """How the signed provenance names an attestation it rests on (an SLSA ResourceDescriptor
    among runDetails.byproducts), with the public key a consumer verifies it by."""
    key = attestation.key
    return {
        "name": published_name(attestation.evidence.gate),
        "digest": {"sha256": attestation.sha256},
        "annotations": {
            "gate": attestation.evidence.gate,
            "runner": runner,
            "keyid": key.keyid,
            "publicKey": json.loads(json.dumps(key.to_dict())),
        },
    }


def check_release(
    provenance: Statement,
    fetch: Callable[[str], Path],
    project: str,
    version: str,
    wheels: Mapping[str, str] | None = None,
) -> list[Attestation]:
    """A consumer's check of the gate attestations a signed provenance rests on: each is fetched
    (`fetch(target) -> local file`, TUF-verified), has the digest the provenance names, is signed
    by the key the provenance names, passed, and names exactly `wheels` (the provenance's wheel
    subjects; by default all its subjects); every gate the provenance says was required has one.
    SigningError says what is wrong."""
    subjects = provenance.subjects if wheels is None else wheels
    checked: list[Attestation] = []
    for byproduct in provenance.byproducts:
        gate, name, annotations = byproduct.gate, byproduct.name, byproduct.annotations
        if gate is None or "/" in name:
            raise SigningError(f"the provenance names a malformed attestation: {byproduct.name} "
                               f"(annotations {dict(annotations)})")  # fmt: skip
        path = fetch(attestation_target(project, version, name))
        if sha256_file(path) != byproduct.sha256:
            raise SigningError(f"{name}: its sha256 is not the one the signed provenance names")
        try:
            key = Key.from_dict(annotations["keyid"], dict(annotations["publicKey"]))
        except (KeyError, TypeError, ValueError) as error:
            raise SigningError(
                f"{name}: the provenance names no usable public key ({error})"
            ) from None
        attestation = read_attestation(path, {key.keyid: key}, "the key the provenance names")
        if attestation.evidence.gate != gate:
            raise SigningError(f"{name}: attests gate {attestation.evidence.gate!r}, not {gate!r}")
        reason = _unusable(attestation.evidence, subjects)
        if reason is not None:
            raise SigningError(f"{name}: {reason}")
        checked.append(attestation)
    missing = sorted(set(provenance.required_gates) - {a.evidence.gate for a in checked})
    if missing:
        raise SigningError(f"the provenance requires gates {', '.join(missing)} but names no "
                           "attestation for them")  # fmt: skip
    return checked
