"""The parity gate against the built wheel, and its negative controls: a one-ulp change in a
rounding rule and a changed eviction order, injected through the reference's test-only switches,
must each be caught and located. A release of several wheels is judged wheel by wheel, each in a
child of an interpreter of its version (stand-in wheels whose engine is the reference, so that
no wheel of another version need be built); how that interpreter, and its numpy, are found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_replay import compare_cell, engine_implementation, reference_implementation, replay
from fixtures_wheels import build_files_wheel, wheel_set
from release_cli import run_release

from release.errors import GateError
from release.gates.parity import run_parity_gate
from release.gates.trace import generate
from release.manifest import load_manifest
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter, interpreter_for
from release.util.private_site import WHEELHOUSE_ENV, numpy_for
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
REQUESTS = "exact-bf16-t16-h2d64-l2-requests-fragmented"
REQUESTS_FAULTS = "int8-fp16-t8-h2d32-l3-requests-faults"
REQUESTS_TIGHT = "exact-fp32-t4-h2d16-l2-requests-tight"
# The checkout's cache (as for the built wheel): numpy sites for interpreters without numpy.
CACHE = REPO / ".activekv" / "cache"


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
    subset = [PRESSURE, REFUSALS, FAULTS, ALL_QUARANTINED, FP8, INT8, REQUESTS, REQUESTS_TIGHT]
    evidence = run_parity_gate(MANIFEST, wheel_set(built_wheel), tmp_path, cells=subset)
    # Some cells are not the gate: every one passed, but the verdict is not a pass.
    assert evidence.verdict == "not-run", evidence.reason
    assert evidence.reason.startswith(f"judged {len(subset)} of the {len(CELLS)} cells (--cell)")
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


@pytest.mark.parametrize("name", [c.name for c in CELLS.values() if c.trace == "requests"])
def test_request_cells_fragment_the_pool_and_split_steps(reference, name):
    outcomes = replay(generate(CELLS[name]), reference)
    kinds = {kind for outcome in outcomes for kind, _ in outcome.events}
    assert {"evict", "hit", "loaded", "commit"} <= kinds
    final = [o.extents for o in outcomes if o.extents is not None][-1]
    assert final["split_steps"] > 0 and final["single_slot_blocks"] > 0
    assert final["extents"] > final["store_steps"]  # some steps took more than one run
    # Some steps still took one extent, and some loads came back as runs of several blocks.
    runs = [(o.extents["last_load_blocks"], o.extents["last_load_runs"]) for o in outcomes
            if o.extents is not None]  # fmt: skip
    assert any(blocks > runs_ for blocks, runs_ in runs)
    assert final["store_steps"] > final["split_steps"]
    if name == REQUESTS_TIGHT:
        assert "refuse" in kinds
    if name == REQUESTS_FAULTS:
        assert {"drop", "quarantine"} <= kinds


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


def test_a_changed_placement_is_caught_by_the_allocator_counts(engine_site, reference):
    """Splitting over the smallest runs first changes no event and no byte: only extent_stats
    show it."""
    reference.module.FAULTS.add("extent_split_smallest")
    difference, _ = compare_cell(
        generate(CELLS[REQUESTS]), reference, engine_implementation(engine_site)
    )
    assert difference is not None and "extent_stats" in difference


def test_unknown_cell_is_refused(built_wheel, tmp_path):
    from release.errors import GateError

    with pytest.raises(GateError, match="--cell"):
        run_parity_gate(MANIFEST, wheel_set(built_wheel), tmp_path, cells=["no-such-cell"])


# --- several wheels, each in an interpreter of its version ---

# The engine of a stand-in wheel: the reference behind the binding's names (so that its replay is
# bit-identical in any interpreter), with an optional skew of every lookup (a planted difference).
_STAND_IN_ENGINE = """\
from types import SimpleNamespace

from reference.engine import Engine as _Reference, stored_block_bytes  # noqa: F401

LOOKUP_SKEW = {skew}


class KvDtype:
    fp16, bf16, fp32 = "fp16", "bf16", "fp32"


def KvBlockLayout(num_layers, block_size, num_kv_heads, head_dim, dtype):
    return SimpleNamespace(num_layers=num_layers, block_size=block_size,
                           num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)


class Engine(_Reference):
    def lookup(self, hashes):
        return super().lookup(hashes) + LOOKUP_SKEW
"""


def _stand_in(dest: Path, tag: str, skew: int = 0) -> Path:
    engine = _STAND_IN_ENGINE.format(skew=skew).encode()
    return build_files_wheel(dest, {"activekv/_engine.py": engine}, name="activekv",
                             version="0.1.0", tag=tag)  # fmt: skip


def _interpreters(*versions: str) -> dict[str, Path]:
    found = {version: find_interpreter(version) for version in versions}
    missing = [version for version, path in found.items() if path is None]
    if missing:
        pytest.skip(f"no Python {', '.join(missing)} on this machine")
    return {version: path for version, path in found.items() if path is not None}


def _wrapper(path: Path, *flags: str) -> Path:
    """An interpreter at another path: this one (with `flags`), run through a shell script."""
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" {" ".join(flags)} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.integration  # pip and child interpreters of three Python versions
def test_every_wheel_is_judged_in_an_interpreter_of_its_version(tmp_path):
    pythons = _interpreters("3.10", "3.11", "3.12")
    tags = ("cp310-cp310-linux_x86_64", "cp311-cp311-linux_x86_64", "cp312-abi3-linux_x86_64")
    wheels = wheel_set(*(_stand_in(tmp_path / "dist", tag) for tag in tags))
    given = (pythons["3.12"], pythons["3.10"])  # --python, matched by version, not by order
    evidence = run_parity_gate(MANIFEST, wheels, tmp_path / "out", cells=[REFUSALS],
                               interpreters=given, cache_dir=CACHE)  # fmt: skip
    assert evidence.verdict == "not-run", evidence.reason  # one cell of them all
    assert "every wheel passed them" in evidence.reason
    assert evidence.artefacts == {wheel.name: wheel.sha256 for wheel in wheels}
    assert len(evidence.artefacts) == 3
    judged = evidence.figures["wheels"]
    expected = {"3.10": str(pythons["3.10"]), "3.11": sys.executable, "3.12": str(pythons["3.12"])}
    if running_python() != "3.11":
        expected["3.11"] = str(pythons["3.11"])
    for wheel in wheels:
        figures = judged[wheel.name]
        assert figures["status"] == "pass"
        assert figures["interpreter"] == expected[wheel.python], wheel.name
        assert figures["python"].startswith(wheel.python + "."), wheel.name  # what its child ran
        assert [c["verdict"] for c in figures["cells"]] == ["bit-identical"]
        assert figures["exact"] == "1 of 1 bit-identical"
    record = json.loads((tmp_path / "out" / "evidence" / "parity.json").read_text())
    assert record["artefacts"] == evidence.artefacts


@pytest.mark.integration
def test_one_wheel_that_differs_fails_the_gate_and_is_named(tmp_path):
    python = _interpreters("3.10")["3.10"]
    here = running_python().replace(".", "")
    wheels = wheel_set(
        _stand_in(tmp_path / "dist", "cp310-cp310-linux_x86_64", skew=1),
        _stand_in(tmp_path / "dist", f"cp{here}-cp{here}-linux_x86_64"),
    )
    evidence = run_parity_gate(MANIFEST, wheels, tmp_path / "out", cells=[REFUSALS],
                               interpreters=[python], cache_dir=CACHE)  # fmt: skip
    assert evidence.verdict == "fail"
    bad, good = (wheel.name for wheel in wheels)
    assert evidence.reason.startswith(f"{bad}: {REFUSALS}: operation ")
    assert "lookup returned" in evidence.reason and good not in evidence.reason
    assert evidence.figures["wheels"][bad]["status"] == "fail"
    assert evidence.figures["wheels"][good]["status"] == "pass"
    assert set(evidence.artefacts) == {bad, good}


@pytest.mark.integration
def test_a_judged_wheel_beside_one_without_an_interpreter_is_not_a_pass(tmp_path):
    here = running_python().replace(".", "")
    (judged,) = wheel_set(_stand_in(tmp_path / "dist", f"cp{here}-cp{here}-linux_x86_64"))
    unknown = Wheel(tmp_path / "activekv-0.1.0-cp399-cp399.whl", "1" * 64, "3.99", ("3.99",), 0)
    evidence = run_parity_gate(MANIFEST, WheelSet((judged, unknown)), tmp_path / "out",
                               cells=[REFUSALS], cache_dir=CACHE)  # fmt: skip
    assert evidence.verdict == "not-run"
    assert evidence.reason == f"{unknown.name}: not run: no Python 3.99 on this runner"
    assert evidence.figures["wheels"][judged.name]["status"] == "pass"
    assert set(evidence.artefacts) == {judged.name, unknown.name}


def test_a_named_interpreter_is_matched_by_the_version_it_reports(tmp_path):
    named = _wrapper(tmp_path / "python-here")
    assert interpreter_for((running_python(),), [named]) == named
    assert interpreter_for(("3.99",), [named]) is None  # named, but of another version
    assert interpreter_for((running_python(),)) == Path(sys.executable)  # none named: this one


def test_a_named_interpreter_that_does_not_run_is_refused(tmp_path):
    with pytest.raises(GateError, match=r"--python .*nowhere: expected a Python interpreter"):
        interpreter_for((running_python(),), [tmp_path / "nowhere"])


def test_parity_refuses_a_named_interpreter_that_does_not_run(tmp_path, capsys, monkeypatch):
    here = running_python().replace(".", "")
    wheel = _stand_in(tmp_path / "dist", f"cp{here}-cp{here}-linux_x86_64")
    result = run_release(["parity", "--wheel", wheel, "--cell", REFUSALS,
                          "--python", tmp_path / "nowhere", "--out", tmp_path / "out"],
                         capsys, monkeypatch)  # fmt: skip
    assert result.returncode == 2, result.stdout
    assert f"--python {tmp_path / 'nowhere'}: expected a Python interpreter that runs" in " ".join(
        result.stderr.split()
    )


@pytest.mark.integration  # pip
def test_numpy_comes_from_the_wheelhouse_into_a_cached_private_site(tmp_path, monkeypatch):
    wheelhouse = tmp_path / "wheelhouse"
    build_files_wheel(wheelhouse, {"numpy/__init__.py": b"__version__ = '2.2.6'\nSTAND_IN = 1\n"},
                      name="numpy", version="2.2.6")  # fmt: skip
    monkeypatch.setenv(WHEELHOUSE_ENV, str(wheelhouse))
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "elsewhere"))  # never seen by pip
    without_numpy = _wrapper(tmp_path / "python-without-site", "-S")  # no site-packages
    site = numpy_for(without_numpy, tmp_path / "cache", "2.2.6")
    assert site == tmp_path / "cache" / "numpy" / f"{running_python()}-2.2.6"
    assert (site / "numpy" / "__init__.py").read_text().endswith("STAND_IN = 1\n")
    monkeypatch.setenv(WHEELHOUSE_ENV, str(tmp_path / "empty"))  # cached: pip is not run again
    assert numpy_for(without_numpy, tmp_path / "cache", "2.2.6") == site
    assert numpy_for(Path(sys.executable), tmp_path / "cache", "2.2.6") is None  # has its own
    result = subprocess.run(
        [str(without_numpy), "-c", "import numpy; print(numpy.STAND_IN)"],
        env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True,
    )  # fmt: skip
    assert result.stdout.strip() == "1", result.stderr
