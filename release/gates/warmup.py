"""The GPU warm-up gate: zero allocations, compute-stream syncs and runtime-stream captures after
warm-up, measured by CUPTI while the wheel under test runs its decode steps on a GPU.

`python -m release gpu-gates [--wheel W ...] [--python PATH ...]`: for every wheel, installs it
into a private directory for an interpreter of its version (`interpreter_for`, the choice parity
makes too), runs `release.scripts.cupti_warmup` there in a child process (the measured run),
judges its report here and writes one `<out>/evidence/warmup.json` naming every wheel's digest,
the GPU's name and the driver. The verdict passes only when the steady phases are clean AND
every planted violation (a cudaMalloc, a compute-stream sync, a capture, each behind the
boundary's back) flips the same judgement, for every wheel. On a machine without a GPU the
evidence says "not run: no GPU runner".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release import gpu
from release.catalogue import WarmupSettings
from release.errors import GateError
from release.evidence import Evidence, write_evidence
from release.gates.contract import GateInputs, Judges, Runner
from release.gates.per_wheel import PerWheel
from release.manifest import Manifest
from release.scripts.cupti_warmup import BOUNDARY_REQUESTS, CONTROLS, PROBE_CONTROLS
from release.util.paths import REPO_ROOT
from release.util.private_site import install_private
from release.util.progress import console
from release.wheelset import Wheel, WheelSet

NAME = "warmup"
# Phases after seal that must be clean (release/scripts/cupti_warmup.py lists every phase).
STEADY_PHASES = ("first-second", "steady", "refusals", "engine-staging")
ALLOCATION_CATEGORIES = frozenset({
    "device_allocation", "async_allocation", "pool_allocation", "vmm_allocation",
    "pinned_allocation", "host_register",
})  # fmt: skip
RULES = ("allocations", "compute_stream_syncs", "context_syncs", "runtime_stream_captures")
# Where libraries may be, relative to a site-packages directory (the NVIDIA wheels), then as
# system paths and sonames; the native loader takes the first that loads.
_WHEEL_LIBRARIES = {
    "cupti": ("nvidia/cu13/lib/libcupti.so.13", "nvidia/cuda_cupti/lib/libcupti.so.12"),
    "cublas": ("nvidia/cu13/lib/libcublas.so.13", "nvidia/cublas/lib/libcublas.so.12"),
}
_SYSTEM_LIBRARIES = {
    "cupti": (
        "/usr/local/cuda/lib64/libcupti.so.13", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
        "libcupti.so.13", "libcupti.so.12", "libcupti.so",
    ),
    "cublas": ("/usr/local/cuda/lib64/libcublas.so.13", "libcublas.so.13", "libcublas.so.12",
               "libcublas.so"),
}  # fmt: skip


def library_candidates(kind: str, site_dirs: Iterable[str] | None = None) -> list[str]:
    """Candidates for libcupti or libcublas: $ACTIVEKV_<KIND>_LIBRARY, NVIDIA wheels, system."""
    candidates = []
    if override := os.environ.get(f"ACTIVEKV_{kind.upper()}_LIBRARY"):
        candidates.append(override)
    dirs = site_dirs if site_dirs is not None else [*sys.path, sysconfig.get_paths()["purelib"]]
    for site in dict.fromkeys(dirs):
        for relative in _WHEEL_LIBRARIES[kind]:
            path = Path(site or ".") / relative
            if path.is_file() and str(path) not in candidates:
                candidates.append(str(path))
    candidates += [name for name in _SYSTEM_LIBRARIES[kind] if name not in candidates]
    return candidates


def phase_violations(counts: Sequence[dict[str, Any]], phase: str) -> dict[str, int]:
    """Calls of `phase` that break each rule, from the monitor's counts."""
    found = dict.fromkeys(RULES, 0)
    for row in counts:
        if row["phase"] != phase:
            continue
        category, calls = row["category"], int(row["calls"])
        if category in ALLOCATION_CATEGORIES:
            found["allocations"] += calls
        elif category == "stream_synchronize" and row["runtime_stream"]:
            found["compute_stream_syncs"] += calls
        elif category == "context_synchronize":
            found["context_syncs"] += calls
        elif category == "stream_capture" and row["runtime_stream"]:
            found["runtime_stream_captures"] += calls
    return found


@dataclass(frozen=True)
class Judgement:
    passed: bool
    problems: list[str]
    figures: dict[str, Any]


def judge(report: dict[str, Any], spec: WarmupSettings) -> Judgement:
    """The verdict on one measured run; every problem is named."""
    problems: list[str] = []
    counts = report["counts"]
    steady = {phase: phase_violations(counts, phase) for phase in STEADY_PHASES}
    for phase, found in steady.items():
        for rule, calls in found.items():
            if calls:
                problems.append(f"phase {phase}: {calls} {rule.replace('_', ' ')} after warm-up")
    controls = {}
    for kind, rule in CONTROLS.items():
        found = phase_violations(counts, f"control-{kind}")
        controls[kind] = found
        if not any(found.values()):
            problems.append(f"negative control {kind}: the planted violation did not flip the "
                            "verdict (the monitor saw nothing)")  # fmt: skip
        elif not found[rule]:
            problems.append(f"negative control {kind}: expected {rule.replace('_', ' ')}; "
                            f"the monitor saw {found}")  # fmt: skip
    if not report["planted"]["capture"].get("enqueue_refused"):
        problems.append("an enqueue onto the captured compute stream was not refused")
    for name in BOUNDARY_REQUESTS:
        outcome = report["boundary_refusals"].get(name)
        if outcome is None:
            problems.append(f"boundary request {name}: not tried")
        elif not outcome["refused"]:
            problems.append(f"boundary request {name}: {outcome['message']}")
    for name in PROBE_CONTROLS:
        outcome = report["probe_controls"].get(name)
        if outcome is None:
            problems.append(f"convention probe control {name}: not tried")
        elif not outcome["refused"]:
            problems.append(f"convention probe control {name}: the worker started")
    probe = report["probe"]
    if probe["packed_matches"] == probe["padded_matches"]:
        problems.append(f"convention probe undecided: {probe}")
    timings = report["timings"]
    required_steps = spec.steady_steps or 1  # the manifest requires it; never zero steps
    for mode in ("latency", "pipelined"):
        if timings[mode]["steps"] < required_steps:
            problems.append(f"{mode}: {timings[mode]['steps']} steady steps; the manifest "
                            f"requires {required_steps}")  # fmt: skip
    if not report["output_max_error"] <= report["output_tolerance"]:
        problems.append(f"decode output off by {report['output_max_error']:.3g} (tolerance "
                        f"{report['output_tolerance']})")  # fmt: skip
    staging = report["engine_staging"]
    if staging["status"] != "pass":
        problems.append(f"engine staging: {staging['status']}")
    elif staging["steps"] < required_steps:
        problems.append(f"engine staging: {staging['steps']} steps; the manifest requires "
                        f"{required_steps}")  # fmt: skip
    warmup = phase_violations(counts, "warmup")
    # Each runtime allocation also reaches the driver: both domains' callbacks, by API name.
    warmup_calls = {
        row["api"]: int(row["calls"])
        for row in counts
        if row["phase"] == "warmup" and row["category"] in ALLOCATION_CATEGORIES
    }
    figures = {
        "decode_step_median_us": round(timings["latency"]["median_us"], 2),
        "decode_step_p99_us": round(timings["latency"]["p99_us"], 2),
        "decode_step_pipelined_us": round(timings["pipelined"]["mean_us"], 2),
        "steady_steps": timings["latency"]["steps"] + timings["pipelined"]["steps"],
        "total_decode_steps": report["total_steps"],
        "warmup_seconds": round(report["warmup_seconds"], 3),
        "warmup_allocations": warmup["allocations"],
        "warmup_allocation_callbacks": warmup_calls,
        "first_second_allocations": steady["first-second"]["allocations"],
        "first_second_steps": report["phases"]["first-second"]["steps"],
        "steady_violations": steady,
        "control_violations": controls,
        "convention": report["convention"],
        "probe": probe,
        "probe_controls": {k: v["refused"] for k, v in report["probe_controls"].items()},
        "boundary_refusals": report["refusal_counts"],
        "capture_control_enqueue_refused": report["planted"]["capture"].get("enqueue_refused"),
        "output_max_error": report["output_max_error"],
        "engine_staging": report["engine_staging"]["status"],
        "executor": report["executor"],
        "cupti": report["cupti"],
        "arena": report["arena"],
        "phases": report["phases"],
        "counts": counts,
    }
    return Judgement(not problems, problems, figures)


def _measure(wheel: Wheel, spec: WarmupSettings, workdir: Path, python: Path) -> dict[str, Any]:
    site = workdir / "site"
    install_private(python, wheel.path, site)
    report_path = workdir / "report.json"
    command = [
        str(python), "-m", "release.scripts.cupti_warmup", "--site", str(site),
        "--warmup-steps", str(spec.warmup_steps or 1),
        "--steady-steps", str(spec.steady_steps or 1),
        "--report", str(report_path),
        *(f"--cupti={path}" for path in library_candidates("cupti")),
        *(f"--cublas={path}" for path in library_candidates("cublas")),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    sys.stderr.write(result.stderr)
    if result.returncode != 0 or not report_path.exists():
        tail = "\n".join(result.stderr.strip().splitlines()[-8:])
        raise GateError(f"warm-up run of {wheel.name} failed (exit {result.returncode}):\n{tail}")
    return json.loads(report_path.read_text())


def _judge_wheel(
    wheel: Wheel, spec: WarmupSettings, python: Path
) -> tuple[list[str], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="activekv-warmup-") as workdir:
        try:
            report = _measure(wheel, spec, Path(workdir), python)
        except GateError as error:
            return [str(error)], {}
    judgement = judge(report, spec)
    return judgement.problems, {"python": report.get("python", ""), **judgement.figures}


def run_warmup_gate(
    manifest: Manifest, wheels: WheelSet, out_dir: Path, interpreters: Sequence[Path] = ()
) -> Evidence:
    """Runs the gate on every wheel on this machine's GPU, each in an interpreter of its version
    (one of `interpreters`, else found here; without one, that wheel is "not run: no Python X.Y
    on this runner" and the gate cannot pass), and writes one evidence record naming all their
    digests (the registry writes "not run: no GPU runner" where there is no GPU)."""
    spec = manifest.gates.get(NAME)
    if spec is None or spec.runner != "gpu":
        raise GateError(f'{manifest.path}: gates.{NAME}: expected a gate with runner = "gpu"')
    if not len(wheels):
        raise GateError("gpu-gates: expected at least one wheel to judge")
    runner = gpu.gpu_identity()
    judged = PerWheel(interpreters)
    for wheel in wheels:
        if (python := judged.interpreter(wheel)) is not None:
            problems, judged.figures[wheel.name] = _judge_wheel(wheel, spec, python)
            judged.found(wheel, problems)
    evidence = Evidence(
        gate=NAME, verdict=judged.verdict, artefacts=wheels.digests,
        figures={"wheels": judged.figures}, reason=judged.reason, runner=runner,
        tools={"python": sys.version.split()[0]},
    )  # fmt: skip
    write_evidence(out_dir, evidence)
    return evidence


class WarmupGate:
    name = NAME
    runner: Runner = "gpu"
    judges = Judges.EVERY_WHEEL_IN_ITS_INTERPRETER
    shared_file = None

    def run(self, inputs: GateInputs) -> Evidence:
        evidence = run_warmup_gate(
            inputs.manifest, inputs.wheels, inputs.out_dir, inputs.options.interpreters
        )
        for line in gpu.figure_lines(evidence):
            console.print(f"  {line}", markup=False, highlight=False)
        return evidence


GATE = WarmupGate()
