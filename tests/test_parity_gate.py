"""The parity gate against the built wheel, and its negative controls: a one-ulp change in a
rounding rule and a changed eviction order, injected through the reference's test-only switches,
must each be caught and located."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_wheels import wheel_set

from release.gates.parity import (
    compare_cell,
    engine_implementation,
    reference_implementation,
    replay,
    run_parity_gate,
)
from release.gates.trace import generate
from release.manifest import load_manifest
from release.util.digests import sha256_file
from release.wheelset import Wheel, WheelSet, running_python

REPO = Path(__file__).resolve().parent.parent
MANIFEST = load_manifest(REPO / "manifests" / "activekv.toml")
CELLS = {cell.name: cell for cell in MANIFEST.gates["parity"].cells}
PRESSURE = "exact-bf16-t16-h8d64-l4-pressure"
REFUSALS = "exact-fp16-t16-h2d64-l2-pressure"
FAULTS = "exact-bf16-t16-h8d64-l4-faults"
ALL_QUARANTINED = "exact-bf16-t16-h2d64-l2-all-quarantined"
FP8 = "fp8-fp16-t8-h2d32-l6-pressure"
INT8 = "int8-bf16-t8-h2d32-l6-pressure"


@pytest.fixture
def reference():
    implementation = reference_implementation()
    from reference import compression

    assert not compression.FAULTS and not implementation.module.FAULTS
    yield implementation
    compression.FAULTS.clear()
    implementation.module.FAULTS.clear()


def _kinds(cell_name: str, implementation) -> set[str]:
    outcomes = replay(generate(CELLS[cell_name]), implementation)
    return {kind for outcome in outcomes for kind, _ in outcome.events}


def test_gate_passes_and_binds_evidence_to_the_wheel(built_wheel, tmp_path):
    subset = [PRESSURE, REFUSALS, FAULTS, ALL_QUARANTINED, FP8, INT8]
    evidence = run_parity_gate(MANIFEST, wheel_set(built_wheel), tmp_path, cells=subset)
    assert evidence.verdict == "pass", evidence.reason
    assert evidence.artefacts == {built_wheel.name: sha256_file(built_wheel)}
    record = json.loads((tmp_path / "evidence" / "parity.json").read_text())
    judged = record["figures"]["wheels"][built_wheel.name]
    assert judged["python"].startswith(running_python() + ".")  # its child ran this version
    assert [c["verdict"] for c in judged["cells"]] == ["bit-identical"] * len(subset)
    assert all(c["events"] > 0 for c in judged["cells"])
    assert (tmp_path / "parity" / "traces" / f"{PRESSURE}.jsonl").exists()


@pytest.mark.parametrize(("fault", "cell", "where"), [
    ("fp8_ulp", FP8, "byte offset"), ("lru_mru_first", PRESSURE, "event"),
])  # fmt: skip
def test_a_planted_reference_fault_fails_the_gate_through_its_child(
    built_wheel, tmp_path, fault, cell, where
):
    """The negative controls, through the same child process the gate runs per wheel."""
    evidence = run_parity_gate(
        MANIFEST, wheel_set(built_wheel), tmp_path, cells=[cell], plant=[fault]
    )
    assert evidence.verdict == "fail"
    assert evidence.reason.startswith(f"{built_wheel.name}: {cell}: operation ")
    assert where in evidence.reason


def test_a_wheel_without_an_interpreter_of_its_version_is_not_run(tmp_path):
    unknown = Wheel(tmp_path / "activekv-0.1.0-cp399-cp399.whl", "1" * 64, "3.99", ("3.99",), 0)
    evidence = run_parity_gate(MANIFEST, WheelSet((unknown,)), tmp_path, cells=[PRESSURE])
    assert evidence.verdict == "not-run"
    assert "not run: no Python 3.99 on this runner" in evidence.reason
    assert evidence.artefacts == {unknown.name: "1" * 64}


def test_cells_exercise_what_they_promise(reference):
    assert {"evict", "commit", "loaded", "hit", "miss"} <= _kinds(PRESSURE, reference)
    assert {"evict", "refuse"} <= _kinds(REFUSALS, reference)
    assert {"quarantine", "load_error"} & _kinds(FAULTS, reference)
    assert "fatal" in _kinds(ALL_QUARANTINED, reference)


def test_a_one_ulp_rounding_change_is_caught_and_located(engine_site, reference):
    from reference import compression

    compression.FAULTS.add("fp8_ulp")
    difference, _ = compare_cell(
        generate(CELLS[FP8]), reference, engine_implementation(engine_site)
    )
    assert difference is not None
    assert "layer" in difference and "byte offset" in difference


def test_a_changed_eviction_order_is_caught(engine_site, reference):
    reference.module.FAULTS.add("lru_mru_first")
    difference, _ = compare_cell(
        generate(CELLS[PRESSURE]), reference, engine_implementation(engine_site)
    )
    assert difference is not None and "event" in difference


def test_unknown_cell_is_refused(built_wheel, tmp_path):
    from release.errors import GateError

    with pytest.raises(GateError, match="--cell"):
        run_parity_gate(MANIFEST, wheel_set(built_wheel), tmp_path, cells=["no-such-cell"])
