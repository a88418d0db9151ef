"""Evidence records (release/evidence.py): publishing is refused unless every required gate passed
on exactly the digests being published; unreadable records are errors that name the file."""

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
    evidence_problems,
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


def test_every_gate_passed_on_these_digests(tmp_path: Path, digests: dict[str, str]) -> None:
    for gate in GATES:
        write_evidence(tmp_path, passing(gate, digests))
    assert evidence_problems(tmp_path, GATES, digests) == []


def test_missing_evidence(tmp_path: Path, digests: dict[str, str]) -> None:
    write_evidence(tmp_path, passing("policy", digests))
    assert read_evidence(tmp_path, "payload") is None
    assert evidence_problems(tmp_path, GATES, digests) == [
        f"payload: no evidence at {tmp_path / 'evidence' / 'payload.json'}"
    ]


def test_failed_verdict_names_the_reason(tmp_path: Path, digests: dict[str, str]) -> None:
    write_evidence(tmp_path, passing("policy", digests))
    write_evidence(
        tmp_path,
        Evidence(
            gate="payload",
            verdict="fail",
            artefacts=dict(digests),
            reason="x.whl: activekv/__init__.py: undeclared Python file",
        ),
    )
    assert evidence_problems(tmp_path, GATES, digests) == [
        "payload: verdict is fail (x.whl: activekv/__init__.py: undeclared Python file)"
    ]


def test_not_run_verdict(tmp_path: Path, digests: dict[str, str]) -> None:
    write_evidence(tmp_path, passing("payload", digests))
    write_evidence(tmp_path, Evidence(gate="policy", verdict="not-run", artefacts=dict(digests)))
    assert evidence_problems(tmp_path, GATES, digests) == ["policy: verdict is not-run"]


def test_evidence_naming_another_digest(tmp_path: Path, digests: dict[str, str]) -> None:
    (name,) = digests
    other = {name: "0" * 64}
    write_evidence(tmp_path, passing("payload", digests))
    write_evidence(tmp_path, passing("policy", other))
    problems = evidence_problems(tmp_path, GATES, digests)
    assert len(problems) == 1
    assert problems[0].startswith("policy: evidence names ")
    assert "0" * 64 in problems[0] and digests[name] in problems[0]


def test_evidence_for_fewer_or_more_wheels_than_published(
    tmp_path: Path, digests: dict[str, str]
) -> None:
    more = {**digests, "activekv-0.1.0-cp311-cp311-linux_x86_64.whl": "1" * 64}
    write_evidence(tmp_path, passing("policy", more))
    write_evidence(tmp_path, passing("payload", digests))
    assert [p.split(":")[0] for p in evidence_problems(tmp_path, GATES, digests)] == ["policy"]
    # ... and the other way round: a gate that judged a subset does not cover the rest.
    assert [p.split(":")[0] for p in evidence_problems(tmp_path, GATES, more)] == ["payload"]


def test_tampered_wheel_no_longer_matches_its_evidence(tmp_path: Path, wheel: Path) -> None:
    judged = {wheel.name: sha256_file(wheel)}
    for gate in GATES:
        write_evidence(tmp_path, passing(gate, judged))
    assert evidence_problems(tmp_path, GATES, judged) == []
    # Same file name, different bytes (a rebuild with other content after the gates ran).
    rebuilt = build_wheel(wheel.parent, salt="tampered")
    assert rebuilt == wheel
    published = {wheel.name: sha256_file(wheel)}
    assert published != judged
    problems = evidence_problems(tmp_path, GATES, published)
    assert [p.split(":")[0] for p in problems] == list(GATES)
    assert all(judged[wheel.name] in p and published[wheel.name] in p for p in problems)


def test_malformed_json_is_an_error_naming_the_path(tmp_path: Path) -> None:
    path = evidence_path(tmp_path, "policy")
    path.parent.mkdir(parents=True)
    path.write_text('{"gate": "policy", ')
    with pytest.raises(GateError, match="expected an evidence record in JSON") as raised:
        read_evidence(tmp_path, "policy")
    assert str(path) in str(raised.value)
    with pytest.raises(GateError):
        evidence_problems(tmp_path, ("policy",), {})


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


def test_record_with_the_schema_but_wrong_fields_is_an_error(
    tmp_path: Path, digests: dict[str, str]
) -> None:
    record = asdict(passing("policy", digests))
    record["unexpected"] = 1
    del record["verdict"]
    path = evidence_path(tmp_path, "policy")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    with pytest.raises(GateError, match="expected the fields of an evidence record") as raised:
        read_evidence(tmp_path, "policy")
    assert str(path) in str(raised.value)


def test_another_gates_record_is_not_evidence_for_this_gate(
    tmp_path: Path, digests: dict[str, str]
) -> None:
    # policy.json copied over payload.json: a passing record, but of another gate.
    write_evidence(tmp_path, passing("policy", digests))
    copied = evidence_path(tmp_path, "payload")
    copied.write_bytes(evidence_path(tmp_path, "policy").read_bytes())
    try:
        problems = evidence_problems(tmp_path, GATES, digests)
    except GateError as error:
        assert str(copied) in str(error)
    else:
        assert [p.split(":")[0] for p in problems] == ["payload"]
