"""The GPU warm-up gate's judgement, library discovery and "not run" path (no GPU needed).

The measured run itself needs a GPU (tests/gpu/evidence/ holds its evidence); here every rule
of the judgement gets a planted violation that must fail it, and the clean report must pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from release.evidence import read_evidence
from release.gates import warmup as gpu_gates
from release.gates.gpu_runner import NO_GPU_RUNNER, detect_gpu
from release.manifest import GateSpec, load_manifest
from release.trust.attestation import read_attestation
from release.trust.sign import load_public_key, load_signer
from release.util.paths import DEFAULT_MANIFEST

REPO = Path(__file__).resolve().parent.parent
SPEC = GateSpec(runner="gpu", warmup_steps=4, steady_steps=1000)


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
        (lambda r: r["engine_staging"].update(status="not run: torch is not installed"),
         "engine staging: not run: torch is not installed"),
        (lambda r: r["engine_staging"].update(steps=999),
         "engine staging: 999 steps; the manifest requires 1000"),
    ],
)  # fmt: skip
def test_each_other_rule_fails_the_gate(change, problem: str) -> None:
    report = clean_report()
    change(report)
    judgement = gpu_gates.judge(report, SPEC)
    assert not judgement.passed
    assert len(judgement.problems) == 1
    assert judgement.problems[0].startswith(problem)


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
def test_without_a_gpu_the_gate_is_not_run_and_stable_refuses(tmp_path: Path) -> None:
    wheel = tmp_path / "activekv-0.1.0-cp312-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not a real wheel: never installed without a GPU")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "release", "gpu-gates", "--wheel", str(wheel), "--out", str(out),
         "--state-dir", str(tmp_path / "state")],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warmup: not-run" in result.stdout
    evidence = read_evidence(out, "warmup")
    assert evidence is not None
    assert evidence.verdict == "not-run"
    assert evidence.reason == NO_GPU_RUNNER
    assert set(evidence.artefacts) == {wheel.name}
    stable = load_manifest(REPO / "manifests" / "activekv.toml").channel("stable")
    assert "warmup" in stable.requires
    _, key = load_signer("generate", channel="dev", state_dir=tmp_path / "state")
    attested = read_attestation(out / "evidence" / "warmup.intoto.json", {key.keyid: key}, "dev")
    assert attested.evidence.verdict == "not-run" and attested.evidence.reason == NO_GPU_RUNNER


def test_gpu_gates_names_a_missing_wheel(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "release", "gpu-gates", "--wheel", str(tmp_path / "nope.whl"),
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
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
    for path in sorted(folder.glob("gpu-parity-*.intoto.json")):
        evidence = read_attestation(path, trusted, "stable's gpu attesters").evidence
        assert evidence.verdict == "pass" and len(evidence.artefacts) == 3, path
        for figures in evidence.figures["wheels"].values():
            assert all(cell["difference"] is None for cell in figures["cells"])
            assert len(figures["cells"]) == 31
