"""The GPU gates without a GPU: the warm-up gate's judgement, library discovery and "not run"
path; the gpu-parity gate's wiring (every wheel, each in an interpreter of its version, on the
CUDA route with the GPU cells) and its "not run" path.

The measured runs themselves need a GPU (tests/gpu/evidence/ holds their evidence); here every
rule of the judgement gets a planted violation that must fail it, and the clean report must pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from release_cli import run_release

from release import gpu
from release.catalogue import WarmupSettings
from release.evidence import read_evidence
from release.gates import parity, per_wheel, registry
from release.gates import warmup as gpu_gates
from release.gates.contract import GateInputs, Judges
from release.gpu import NO_GPU_RUNNER, detect_gpu
from release.manifest import load_manifest
from release.trust.attestation import read_attestation
from release.trust.sign import load_public_key, load_signer
from release.util.paths import DEFAULT_MANIFEST

REPO = Path(__file__).resolve().parent.parent
SPEC = WarmupSettings(runner="gpu", warmup_steps=4, steady_steps=1000)


def _count(phase: str, category: str, calls: int = 1, runtime_stream: bool = False,
           api: str = "cudaMalloc_v3020") -> dict[str, Any]:  # fmt: skip
    return {"phase": phase, "domain": "runtime", "callback_id": 20, "api": api,
            "category": category, "runtime_stream": runtime_stream, "calls": calls}  # fmt: skip


def clean_report() -> dict[str, Any]:
    """A measured run that keeps every rule, with each planted control seen by the monitor."""
    timing = {"steps": 1000, "seconds": 0.1, "mean_us": 90.0, "median_us": 88.0,
              "p99_us": 120.0, "min_us": 80.0, "max_us": 150.0}  # fmt: skip
    return {
        "counts": [
            _count("warmup", "device_allocation", 7),
            _count("warmup", "pinned_allocation", 1, api="cudaHostAlloc_v3020"),
            _count("steady", "event_synchronize", 1000, api="cudaEventSynchronize_v3020"),
            _count("control-device_allocation", "device_allocation"),
            _count("control-compute_stream_sync", "stream_synchronize", runtime_stream=True),
            _count("control-capture", "stream_capture", runtime_stream=True),
        ],
        "planted": {
            "device_allocation": {},
            "compute_stream_sync": {},
            "capture": {"enqueue_refused": True},
        },
        "boundary_refusals": {
            name: {"refused": True, "message": "refused"}
            for name in ("allocation", "compute_sync", "capture")
        },
        "probe_controls": {
            "both_match": {"refused": True, "message": "both"},
            "neither_matches": {"refused": True, "message": "neither"},
        },
        "probe": {
            "packed_matches": False,
            "padded_matches": True,
            "packed_max_error": 0.4,
            "padded_max_error": 1e-7,
            "tolerance": 1e-3,
        },
        "timings": {"latency": dict(timing), "pipelined": dict(timing)},
        "output_max_error": 1e-7,
        "output_tolerance": 1e-3,
        "engine_staging": {"status": "pass", "steps": 1000, "blocks_loaded": 63936},
        "warmup_seconds": 0.8,
        "phases": {"first-second": {"seconds": 1.0, "steps": 9000}},
        "total_steps": 12000,
        "convention": "padded",
        "refusal_counts": {"arena": 1, "sync": 1, "capture": 1, "enqueue": 1},
        "executor": {"name": "cublas", "library": "libcublas.so.13", "cublas_version": 130000},
        "cupti": {"library": "libcupti.so.13", "version": 26, "tracked_callbacks": 90},
        "arena": {"sealed": True},
    }


def test_clean_report_passes_with_figures() -> None:
    judgement = gpu_gates.judge(clean_report(), SPEC)
    assert judgement.problems == []
    assert judgement.passed
    figures = judgement.figures
    assert figures["decode_step_median_us"] == 88.0
    assert figures["warmup_allocations"] == 8  # allowed during warm-up, and reported
    assert figures["warmup_allocation_callbacks"] == {
        "cudaMalloc_v3020": 7,
        "cudaHostAlloc_v3020": 1,
    }
    assert figures["first_second_allocations"] == 0
    assert figures["control_violations"]["device_allocation"]["allocations"] == 1
    assert figures["engine_staging"] == "pass"


@pytest.mark.parametrize(
    ("phase", "category", "runtime_stream", "rule"),
    [
        ("steady", "device_allocation", False, "allocations"),
        ("first-second", "async_allocation", False, "allocations"),
        ("steady", "pool_allocation", False, "allocations"),
        ("steady", "vmm_allocation", False, "allocations"),
        ("refusals", "pinned_allocation", False, "allocations"),
        ("steady", "host_register", False, "allocations"),
        ("steady", "stream_synchronize", True, "compute stream syncs"),
        ("steady", "context_synchronize", False, "context syncs"),
        ("engine-staging", "stream_capture", True, "runtime stream captures"),
    ],
)
def test_planted_violation_after_warmup_fails(phase, category, runtime_stream, rule) -> None:
    report = clean_report()
    report["counts"].append(_count(phase, category, 3, runtime_stream))
    judgement = gpu_gates.judge(report, SPEC)
    assert not judgement.passed
    assert judgement.problems == [f"phase {phase}: 3 {rule} after warm-up"]


def test_calls_off_runtime_streams_and_event_waits_do_not_count() -> None:
    report = clean_report()
    report["counts"] += [
        _count("steady", "stream_synchronize", 2, runtime_stream=False),  # someone else's stream
        _count("steady", "stream_capture", 2, runtime_stream=False),
        _count("steady", "event_synchronize", 5),
    ]
    assert gpu_gates.judge(report, SPEC).passed


@pytest.mark.parametrize("kind", sorted(gpu_gates.CONTROLS))
def test_a_control_the_monitor_missed_fails_the_gate(kind: str) -> None:
    report = clean_report()
    report["counts"] = [c for c in report["counts"] if c["phase"] != f"control-{kind}"]
    judgement = gpu_gates.judge(report, SPEC)
    assert not judgement.passed
    assert judgement.problems == [
        f"negative control {kind}: the planted violation did not flip the verdict "
        "(the monitor saw nothing)"
    ]


def test_a_control_seen_under_the_wrong_rule_fails_the_gate() -> None:
    report = clean_report()
    for row in report["counts"]:
        if row["phase"] == "control-capture":
            row["runtime_stream"] = False  # the capture was not recognised as on our stream
    report["counts"].append(_count("control-capture", "device_allocation"))
    judgement = gpu_gates.judge(report, SPEC)
    assert not judgement.passed
    assert "expected runtime stream captures" in judgement.problems[0]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r["planted"]["capture"].update(enqueue_refused=False),
         "an enqueue onto the captured compute stream was not refused"),
        (lambda r: r["boundary_refusals"]["compute_sync"].update(refused=False,
                                                                 message="the request was served"),
         "boundary request compute_sync: the request was served"),
        (lambda r: r["probe_controls"]["both_match"].update(refused=False),
         "convention probe control both_match: the worker started"),
        (lambda r: r["probe"].update(packed_matches=True),
         "convention probe undecided"),
        (lambda r: r["timings"]["pipelined"].update(steps=999),
         "pipelined: 999 steady steps; the manifest requires 1000"),
        (lambda r: r.update(output_max_error=0.5), "decode output off by 0.5"),
        (lambda r: r.update(output_max_error=float("nan")), "decode output off by nan"),
        (lambda r: r["engine_staging"].update(status="fail: 3 regions quarantined"),
         "engine staging: fail: 3 regions quarantined"),
        (lambda r: r["engine_staging"].update(status="fail: 2 blocks loaded; expected 64"),
         "engine staging: fail: 2 blocks loaded; expected 64"),
        (lambda r: r["engine_staging"].update(steps=999),
         "engine staging: 999 steps; the manifest requires 1000"),
        (lambda r: r["boundary_refusals"].pop("allocation"),
         "boundary request allocation: not tried"),
        (lambda r: r["boundary_refusals"].pop("capture"), "boundary request capture: not tried"),
        (lambda r: r["probe_controls"].pop("neither_matches"),
         "convention probe control neither_matches: not tried"),
    ],
)  # fmt: skip
def test_each_other_rule_fails_the_gate(change, problem: str) -> None:
    report = clean_report()
    change(report)
    judgement = gpu_gates.judge(report, SPEC)
    assert not judgement.passed
    assert len(judgement.problems) == 1
    assert judgement.problems[0].startswith(problem)


def test_zero_steady_steps_are_never_a_pass_even_without_a_manifest_minimum() -> None:
    report = clean_report()
    report["timings"]["latency"].update(steps=0)
    judgement = gpu_gates.judge(report, WarmupSettings(runner="gpu"))
    assert judgement.problems == ["latency: 0 steady steps; the manifest requires 1"]


def test_library_candidates_prefer_override_then_wheels_then_system(tmp_path, monkeypatch):
    wheel_lib = tmp_path / "nvidia" / "cu13" / "lib" / "libcupti.so.13"
    wheel_lib.parent.mkdir(parents=True)
    wheel_lib.write_bytes(b"")
    monkeypatch.setenv("ACTIVEKV_CUPTI_LIBRARY", "/opt/custom/libcupti.so")
    candidates = gpu_gates.library_candidates("cupti", [str(tmp_path), str(tmp_path / "none")])
    assert candidates[0] == "/opt/custom/libcupti.so"
    assert candidates[1] == str(wheel_lib)
    assert candidates[-3:] == ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
    monkeypatch.delenv("ACTIVEKV_CUPTI_LIBRARY")
    assert gpu_gates.library_candidates("cublas", [str(tmp_path)])[0] == (
        "/usr/local/cuda/lib64/libcublas.so.13"
    )


@pytest.mark.skipif(detect_gpu() is not None, reason="this machine has a GPU runner")
def test_without_a_gpu_the_gate_is_not_run_and_stable_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "activekv-0.1.0-cp312-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not a real wheel: never installed without a GPU")
    out = tmp_path / "out"
    result = run_release(["gpu-gates", "--wheel", wheel, "--out", out,
                          "--state-dir", tmp_path / "state"], capsys, monkeypatch)  # fmt: skip
    assert result.returncode == 0, result.stderr
    stable = load_manifest(REPO / "manifests" / "activekv.toml").channel("stable")
    for gate in ("warmup", "gpu-parity"):  # every GPU gate of the manifest
        assert f"{gate}: not-run" in result.stdout
        evidence = read_evidence(out, gate)
        assert evidence is not None
        assert evidence.verdict == "not-run"
        assert evidence.reason == NO_GPU_RUNNER
        assert set(evidence.artefacts) == {wheel.name}
        assert gate in stable.requires
    _, key = load_signer("generate", channel="dev", state_dir=tmp_path / "state")
    attested = read_attestation(out / "evidence" / "warmup.intoto.json", {key.keyid: key}, "dev")
    assert attested.evidence.verdict == "not-run" and attested.evidence.reason == NO_GPU_RUNNER


def test_gpu_gates_names_a_missing_wheel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_release(["gpu-gates", "--wheel", tmp_path / "nope.whl", "--out", tmp_path],
                         capsys, monkeypatch)  # fmt: skip
    assert result.returncode == 2
    assert "--wheel" in result.stderr
    assert "nope.whl: expected a wheel file; got no such file" in result.stderr


def test_committed_gpu_attestations_are_whole() -> None:
    """The committed attestations of the last GPU run (tests/gpu/evidence/*.intoto.json), not of
    this build: signed by the runner key stable lists, passed on every wheel each in its own
    interpreter, every control flipped the verdict and the engine's staging steps ran clean."""
    manifest = load_manifest(DEFAULT_MANIFEST)
    keys = [load_public_key(DEFAULT_MANIFEST.parent / attester)
            for attester in manifest.channel("stable").attesters["gpu"]]  # fmt: skip
    trusted = {key.keyid: key for key in keys}
    folder = REPO / "tests" / "gpu" / "evidence"
    for path in sorted(folder.glob("warmup-*.intoto.json")):
        evidence = read_attestation(path, trusted, "stable's gpu attesters").evidence
        assert evidence.gate == "warmup" and evidence.verdict == "pass", path
        assert evidence.runner["gpu"] and evidence.runner["driver"]
        assert len(evidence.artefacts) == 3  # cp310, cp311 and the abi3 wheel
        for wheel, figures in evidence.figures["wheels"].items():
            assert figures["python"][:4] in wheel.replace("cp3", "3.")  # its own interpreter
            assert figures["steady_steps"] >= 2 * 1000
            assert figures["first_second_allocations"] == 0
            for phase, found in figures["steady_violations"].items():
                assert not any(found.values()), phase
            for kind, rule in gpu_gates.CONTROLS.items():
                assert figures["control_violations"][kind][rule] > 0, kind
            assert figures["engine_staging"] == "pass"
    parity = manifest.gates["parity"]
    declared = {cell.name for cell in (*(parity.cells or ()), *(parity.gpu_cells or ()))}
    for path in sorted(folder.glob("gpu-parity-*.intoto.json")):
        evidence = read_attestation(path, trusted, "stable's gpu attesters").evidence
        assert evidence.verdict == "pass" and len(evidence.artefacts) == 3, path
        for figures in evidence.figures["wheels"].values():
            assert all(cell["difference"] is None for cell in figures["cells"])
            # Every cell the manifest declares, the GPU ones too, was replayed.
            assert {cell["cell"] for cell in figures["cells"]} == declared


# --- gpu-parity ---

MANIFEST = load_manifest(DEFAULT_MANIFEST)
TAGS = ("cp310-cp310-manylinux_2_28_x86_64", "cp311-cp311-manylinux_2_28_x86_64",
        "cp312-abi3-manylinux_2_28_x86_64")  # fmt: skip


def _wheels(tmp_path: Path):
    from fixtures_wheels import build_wheel, wheel_set

    return wheel_set(*(build_wheel(tmp_path / "dist", tag=tag) for tag in TAGS))


def _inputs(tmp_path: Path, gpu: str | None) -> GateInputs:
    return GateInputs(MANIFEST, _wheels(tmp_path), tmp_path / "out", REPO, tmp_path / "cache", gpu)


def test_gpu_parity_is_a_registered_gpu_gate_judging_every_wheel_in_its_interpreter() -> None:
    gate = registry.load("gpu-parity")
    assert (gate.runner, gate.judges) == ("gpu", Judges.EVERY_WHEEL_IN_ITS_INTERPRETER)
    assert registry.load("parity").judges == Judges.EVERY_WHEEL_IN_ITS_INTERPRETER
    assert MANIFEST.gates["gpu-parity"].runner == "gpu"


@pytest.mark.skipif(detect_gpu() is not None, reason="this machine has a GPU runner")
def test_gpu_parity_without_a_gpu_is_not_run_and_names_every_wheel(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, gpu=None)
    evidence = registry.run_gate("gpu-parity", inputs)
    assert (evidence.gate, evidence.verdict, evidence.reason) == (
        "gpu-parity", "not-run", NO_GPU_RUNNER)  # fmt: skip
    assert evidence.artefacts == inputs.wheels.digests and len(evidence.artefacts) == 3


def _fake_gpu_replay(monkeypatch, differs: str | None = None) -> list[dict[str, Any]]:
    """The children gpu-parity would start, recorded instead (no GPU here); each reports its
    interpreter's version and every cell identical, but the cell `differs`."""
    started: list[dict[str, Any]] = []

    def replay_wheel(wheel, traces, workdir, *, device, python, cache_dir, plant):
        started.append({"wheel": wheel.name, "device": device, "python": python,
                        "cells": [trace.stem for trace in traces]})  # fmt: skip
        cells = [{"cell": trace.stem, "operations": 48, "events": 9, "seconds": 0.1,
                  "difference": "operation 3: layer 2: device block 5: byte offset 7"
                  if trace.stem == differs else None} for trace in traces]  # fmt: skip
        return {"python": python.name.removeprefix("python") + ".0", "numpy": "2.2.6",
                "engine": "activekv/_engine.so", "cells": cells}  # fmt: skip

    monkeypatch.setattr(parity, "_replay_wheel", replay_wheel)
    monkeypatch.setattr(per_wheel, "interpreter_for",
                        lambda serves, given: Path(f"/runner/python{serves[0]}"))  # fmt: skip
    monkeypatch.setattr(gpu, "gpu_identity", lambda: {"kind": "gpu", "gpu": "NVIDIA H200",
                                                             "driver": "580.1"})  # fmt: skip
    return started


def test_gpu_parity_replays_every_wheel_on_the_cuda_route_in_its_interpreter(
    tmp_path: Path, monkeypatch
) -> None:
    started = _fake_gpu_replay(monkeypatch)
    inputs = _inputs(tmp_path, gpu="NVIDIA H200")
    evidence = registry.run_gate("gpu-parity", inputs)
    assert evidence.verdict == "pass", evidence.reason
    assert evidence.gate == "gpu-parity" and evidence.runner["gpu"] == "NVIDIA H200"
    assert evidence.artefacts == inputs.wheels.digests and len(evidence.artefacts) == 3
    spec = MANIFEST.gates["parity"]
    cells = [cell.name for cell in [*spec.cells, *(spec.gpu_cells or ())]]
    assert [run["wheel"] for run in started] == [wheel.name for wheel in inputs.wheels]
    for run, wheel in zip(started, inputs.wheels, strict=True):
        assert run["device"] == "cuda" and run["cells"] == cells
        assert run["python"] == Path(f"/runner/python{wheel.python}")  # its version's
        figures = evidence.figures["wheels"][wheel.name]
        assert figures["python"].startswith(wheel.python + ".")
        assert figures["interpreter"] == f"/runner/python{wheel.python}"
    assert read_evidence(tmp_path / "out", "gpu-parity") == evidence


def test_gpu_parity_fails_naming_the_wheel_cell_and_byte(tmp_path: Path, monkeypatch) -> None:
    cell = MANIFEST.gates["parity"].gpu_cells[0].name
    _fake_gpu_replay(monkeypatch, differs=cell)
    evidence = registry.run_gate("gpu-parity", _inputs(tmp_path, gpu="NVIDIA H200"))
    assert evidence.verdict == "fail"
    first = next(iter(evidence.artefacts))
    assert evidence.reason.startswith(f"{first}: {cell}: operation 3: layer 2: device block 5: "
                                      "byte offset 7")  # fmt: skip


@pytest.mark.skipif(detect_gpu() is not None, reason="this machine has a GPU runner")
def test_parity_device_cuda_is_the_gpu_parity_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = _wheels(tmp_path).wheels[0].path
    result = run_release(["parity", "--device", "cuda", "--wheel", wheel, "--out", tmp_path / "out",
                          "--state-dir", tmp_path / "state"], capsys, monkeypatch)  # fmt: skip
    assert result.returncode == 1, result.stderr  # one gate alone: only a pass is 0
    assert "gpu-parity: not-run" in result.stdout
    evidence = read_evidence(tmp_path / "out", "gpu-parity")
    assert evidence is not None and evidence.reason == NO_GPU_RUNNER
    assert read_evidence(tmp_path / "out", "parity") is None
