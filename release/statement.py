"""The in-toto Statements the pipeline writes and reads, as data: their types, the DSSE
envelope they travel in, their subjects, and a gate's verdict as a statement. No signature is
made or checked here (release/trust/sign.py does both): a reader here is for showing what a
signed file says, or for sorting candidates, never for deciding to trust one.

Below trust and report, which both read statements: may import ``release.errors``,
``release.evidence`` and ``release.util``.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import FormatError
from securesystemslib.signer import Key

from release.errors import SigningError
from release.evidence import Evidence, evidence_from_fields
from release.util.jsonfile import JsonFileError, parse_json

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
GATE_PREDICATE_TYPE = "https://github.com/activekv/release/gate-verdict/v1"
SUFFIX = ".intoto.json"  # an envelope's file name ends so


def subject_digests(statement: Mapping[str, Any]) -> dict[str, str]:
    """File name to sha256 for every subject of ``statement``."""
    try:
        return {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    except (KeyError, TypeError) as exc:
        raise SigningError(f"statement subjects are malformed (missing {exc})") from None


@dataclass(frozen=True)
class Byproduct:
    """One gate attestation a release's provenance names (predicate.runDetails.byproducts[]):
    the file name it is published under, the sha256 it must have, and its annotations as written
    (the gate, the signer's key), which the reader that trusts them checks."""

    name: str
    sha256: str
    annotations: Mapping[str, Any]

    @property
    def gate(self) -> str | None:
        gate = self.annotations.get("gate")
        return gate if isinstance(gate, str) else None


@dataclass(frozen=True, eq=False)
class Statement(Mapping[str, Any]):
    """An in-toto v1 Statement as it was read: the fields the pipeline reads, typed, and the
    document itself (a read-only mapping, as signed) for keys and for what no field covers.

    Its shape was checked once, when it was read (:meth:`from_dict`); a field another reader
    needs is checked where it is first read, with the message that reader gave before."""

    raw: Mapping[str, Any]

    @classmethod
    def from_dict(cls, path: Path, data: object) -> Statement:
        """`data` (decoded from `path`) as a Statement; SigningError naming the file else."""
        if not isinstance(data, dict) or data.get("_type") != STATEMENT_TYPE:
            raise SigningError(f"{path}: the payload is not an in-toto v1 Statement")
        if not isinstance(data.get("subject"), list):
            raise SigningError(f"{path}: the statement has no subject list")
        return cls(data)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    @property  # not cached: the document is a caller's mapping, which may change
    def subjects(self) -> dict[str, str]:
        """File name to sha256 of every subject (SigningError when one is malformed)."""
        return subject_digests(self.raw)

    @property
    def gate(self) -> str | None:
        """The gate a gate statement claims to attest; None for another kind of statement."""
        predicate = self.raw.get("predicate")
        if self.raw.get("predicateType") != GATE_PREDICATE_TYPE or not isinstance(predicate, dict):
            return None
        gate = predicate.get("gate")
        return gate if isinstance(gate, str) else None

    @property
    def byproducts(self) -> tuple[Byproduct, ...]:
        """The gate attestations a provenance names (none for a gate's own statement);
        SigningError naming the first entry without a name and a sha256."""
        run = _field(self.raw, "predicate", "runDetails")
        entries = run.get("byproducts", []) if isinstance(run, Mapping) else []
        if not isinstance(entries, list):
            raise SigningError(f"predicate.runDetails.byproducts: expected a list; got {entries!r}")
        found = []
        for index, entry in enumerate(entries):
            name, sha256 = _field(entry, "name"), _field(entry, "digest", "sha256")
            annotations = _field(entry, "annotations")
            annotations = {} if annotations is None else annotations
            named = isinstance(name, str) and isinstance(sha256, str)
            if not named or not isinstance(annotations, Mapping):
                raise SigningError(
                    f"predicate.runDetails.byproducts[{index}]: expected an attestation's name "
                    f"and sha256 digest; got {entry!r}"
                )
            found.append(Byproduct(name, sha256, annotations))
        return tuple(found)

    @property
    def required_gates(self) -> tuple[str, ...]:
        """The gates a provenance says its channel required (externalParameters.gates)."""
        gates = _field(self.raw, "predicate", "buildDefinition", "externalParameters", "gates")
        return tuple(g for g in gates if isinstance(g, str)) if isinstance(gates, list) else ()

    @property
    def version(self) -> object:
        """The version a release's provenance says it is of (None when it says none)."""
        return _field(self.raw, "predicate", "buildDefinition", "externalParameters", "version")


def _field(document: object, *keys: str) -> object:
    """The value under `keys` in nested mappings; None where one is missing or not a mapping."""
    for key in keys:
        if not isinstance(document, Mapping):
            return None
        document = document.get(key)
    return document


@dataclass(frozen=True)
class SignedStatement:
    """A statement whose envelope's signature verified: the file, the sha256 of the bytes that
    verified, and the key whose signature they carry."""

    statement: Statement
    path: Path
    sha256: str
    key: Key

    def at(self, path: Path, sha256: str) -> SignedStatement | None:
        """This statement as the file at `path` holds it, when that file's bytes (`sha256`) are
        the very ones that verified: a copy carries the same signature. None for other bytes."""
        return (
            SignedStatement(self.statement, path, sha256, self.key)
            if sha256 == self.sha256
            else None
        )


def read_statement_unverified(path: Path) -> Statement:
    """The statement inside the envelope at ``path`` WITHOUT checking its signature.

    For consistency checks only (e.g. that an envelope names the files being published);
    trust decisions use release/trust/sign.py's ``read_and_verify_envelope``.
    """
    return decode_statement(path, read_envelope(path))


def read_envelope(path: Path) -> Envelope:
    """The DSSE envelope at ``path`` of an in-toto payload; SigningError naming the file."""
    return read_envelope_bytes(path)[0]


def read_envelope_bytes(path: Path) -> tuple[Envelope, bytes]:
    """The DSSE envelope at ``path`` and the bytes it was read from; SigningError naming the
    file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise SigningError(f"{path}: cannot read the envelope ({exc.strerror})") from None
    except OSError as exc:  # as read_json says it: a folder, an unreadable file
        raise SigningError(f"{path}: the envelope is not JSON (expected a readable file; got "
                           f"{exc.strerror or exc})") from None  # fmt: skip
    try:
        data = parse_json(raw)
    except JsonFileError as exc:
        raise SigningError(f"{path}: the envelope is not JSON ({exc})") from None
    try:
        envelope = Envelope.from_dict(data)
    except (KeyError, TypeError, ValueError, FormatError, binascii.Error) as exc:
        raise SigningError(f"{path}: not a DSSE envelope ({type(exc).__name__}: {exc})") from None
    if envelope.payload_type != PAYLOAD_TYPE:
        raise SigningError(
            f"{path}: payload type is {envelope.payload_type!r}, expected {PAYLOAD_TYPE!r}"
        )
    return envelope, raw


def decode_statement(path: Path, envelope: Envelope) -> Statement:
    """The in-toto v1 Statement `envelope` carries (its signatures unchecked)."""
    try:
        statement = parse_json(envelope.payload)
    except JsonFileError as exc:
        raise SigningError(f"{path}: the payload is not JSON ({exc})") from None
    return Statement.from_dict(path, statement)


# --- a gate's verdict


def gate_statement(evidence: Evidence) -> dict[str, Any]:
    """The in-toto Statement of one gate run: its judged wheels and its evidence."""
    predicate = {k: v for k, v in asdict(evidence).items() if k not in ("artefacts", "schema")}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": digest}}
            for name, digest in sorted(evidence.artefacts.items())
        ],
        "predicateType": GATE_PREDICATE_TYPE,
        "predicate": predicate,
    }


def gate_evidence(path: Path, statement: Mapping[str, Any]) -> Evidence:
    """The evidence a gate statement holds (SigningError naming `path` for another shape)."""
    if statement.get("predicateType") != GATE_PREDICATE_TYPE:
        raise SigningError(f"{path}: predicateType: expected {GATE_PREDICATE_TYPE!r}; got "
                           f"{statement.get('predicateType')!r}")  # fmt: skip
    predicate = statement.get("predicate")
    if not isinstance(predicate, dict):
        raise SigningError(f"{path}: predicate: expected the fields of a gate's evidence; got "
                           f"{type(predicate).__name__}")  # fmt: skip
    try:
        return evidence_from_fields({**predicate, "artefacts": subject_digests(statement)})
    except ValueError as error:
        raise SigningError(f"{path}: predicate: {error}") from None


def attested_evidence(path: Path) -> Evidence:
    """The evidence an attestation holds, read WITHOUT checking its signature: for showing what a
    signed provenance rests on (publishing verified it when it signed)."""
    return gate_evidence(path, read_statement_unverified(path))


def attested_gate(path: Path) -> str | None:
    """The gate an envelope claims to attest, read WITHOUT checking its signature (to sort
    candidates only; None for the envelope of another kind of statement). SigningError for a
    file that is not a DSSE envelope of an in-toto Statement."""
    return read_statement_unverified(path).gate


def other_wheels(judged: Mapping[str, str], digests: Mapping[str, str]) -> str | None:
    """How the wheels a gate judged (`judged`, name to sha256) differ from `digests`; None when
    they are the same wheels."""
    if judged == digests:
        return None
    changed = [f"{name} (attested {judged[name][:12]}, built {digest[:12]})"
               for name, digest in sorted(digests.items())
               if name in judged and judged[name] != digest]  # fmt: skip
    missing = sorted(set(digests) - set(judged))
    extra = sorted(set(judged) - set(digests))
    parts = [f"changed since it was judged: {', '.join(changed)}"] if changed else []
    parts += [f"not judged: {', '.join(missing)}"] if missing else []
    parts += [f"judged but not published: {', '.join(extra)}"] if extra else []
    return "names other wheels; " + "; ".join(parts)
