"""Evidence records (release/evidence.py): what each gate judged, as the report reads it; unreadable
records are errors that name the file. (Publishing reads the signed attestations instead:
tests/test_attestation.py.)"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from fixtures_wheels import build_wheel

from release.errors import GateError
from release.evidence import (
    EVIDENCE_SCHEMA,
    Evidence,
    evidence_path,
    read_evidence,
    write_evidence,
)
from release.util.digests import sha256_file

GATES = ("policy", "payload")


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    return build_wheel(tmp_path / "dist")


@pytest.fixture
def digests(wheel: Path) -> dict[str, str]:
    return {wheel.name: sha256_file(wheel)}


def passing(gate: str, digests: dict[str, str]) -> Evidence:
    return Evidence(gate=gate, verdict="pass", artefacts=dict(digests), figures={"n": 1})


def test_write_then_read_round_trips(tmp_path: Path, digests: dict[str, str]) -> None:
    evidence = passing("policy", digests)
    path = write_evidence(tmp_path, evidence)
    assert path == evidence_path(tmp_path, "policy") == tmp_path / "evidence" / "policy.json"
    assert json.loads(path.read_text())["schema"] == EVIDENCE_SCHEMA
    assert read_evidence(tmp_path, "policy") == evidence
    assert not list(path.parent.glob("*.tmp"))


def test_malformed_json_is_an_error_naming_the_path(tmp_path: Path) -> None:
    path = evidence_path(tmp_path, "policy")
    path.parent.mkdir(parents=True)
    path.write_text('{"gate": "policy", ')
    with pytest.raises(GateError, match="evidence record: expected JSON") as raised:
        read_evidence(tmp_path, "policy")
    assert str(path) in str(raised.value)


@pytest.mark.parametrize(
    ("content", "got"),
    [
        ({"schema": "activekv.evidence/v0"}, "'activekv.evidence/v0'"),
        ({"gate": "policy"}, "None"),
        (["policy", "pass"], "'list'"),
    ],
)
def test_wrong_schema_is_an_error_naming_the_path(
    tmp_path: Path, content: object, got: str
) -> None:
    path = evidence_path(tmp_path, "policy")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(content))
    with pytest.raises(GateError) as raised:
        read_evidence(tmp_path, "policy")
    message = str(raised.value)
    assert message.startswith(f"{path}: schema: expected {EVIDENCE_SCHEMA!r}")
    assert message.endswith(f"got {got}")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"verdict": None}, "verdict: expected"),  # None: the key is left out
        ({"unexpected": 1}, "unexpected: expected"),
        ({"verdict": "PASSED"}, "verdict: expected input should be 'pass', 'fail' or 'not-run'"),
        ({"figures": "nope"}, "figures: expected"),
        ({"artefacts": {"w.whl": "not a digest"}}, "artefacts.w.whl: expected"),
        ({"runner": None}, "runner: expected field required"),
        ({"time": None}, "time: expected field required"),
        ({"reason": 3}, "reason: expected"),
    ],
)
def test_a_field_missing_or_of_another_type_is_named(
    tmp_path: Path, digests: dict[str, str], change: dict[str, object], named: str
) -> None:
    record = asdict(passing("policy", digests))
    for key, value in change.items():
        if value is None:
            del record[key]
        else:
            record[key] = value
    path = evidence_path(tmp_path, "policy")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    with pytest.raises(GateError) as raised:
        read_evidence(tmp_path, "policy")
    assert str(raised.value).startswith(f"{path}: {named}")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfe{}", "expected UTF-8 text"),
        (b"[" * 100_000, "nested deeper than the parser goes"),
        (b'{"schema": NaN}', "got NaN, which JSON does not allow"),
    ],
)
def test_a_file_that_is_not_a_json_record_is_named(
    tmp_path: Path, content: bytes, said: str
) -> None:
    path = evidence_path(tmp_path, "policy")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(GateError, match=said) as raised:
        read_evidence(tmp_path, "policy")
    assert str(raised.value).startswith(f"{path}: evidence record: ")


def test_a_folder_in_place_of_a_record_is_named(tmp_path: Path) -> None:
    evidence_path(tmp_path, "policy").mkdir(parents=True)
    with pytest.raises(GateError, match="expected a readable file"):
        read_evidence(tmp_path, "policy")


def test_a_figure_that_is_not_a_finite_number_is_refused_before_writing(
    tmp_path: Path, digests: dict[str, str]
) -> None:
    evidence = Evidence(gate="policy", verdict="pass", artefacts=digests,
                        figures={"ratio": float("inf")})  # fmt: skip
    with pytest.raises(GateError, match="figures: expected finite numbers"):
        write_evidence(tmp_path, evidence)
    assert not evidence_path(tmp_path, "policy").exists()


def test_another_gates_record_is_not_evidence_for_this_gate(
    tmp_path: Path, digests: dict[str, str]
) -> None:
    # policy.json copied over payload.json: a passing record, but of another gate.
    write_evidence(tmp_path, passing("policy", digests))
    copied = evidence_path(tmp_path, "payload")
    copied.write_bytes(evidence_path(tmp_path, "policy").read_bytes())
    with pytest.raises(GateError, match="gate: expected 'payload'; got 'policy'") as raised:
        read_evidence(tmp_path, "payload")
    assert str(copied) in str(raised.value)
