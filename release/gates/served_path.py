"""The served-path gate (`python -m release served-path`): native code is what serves vLLM's hooks.

It installs the wheel into a private folder for an interpreter that has vLLM (Python 3.12 or
newer), and runs release/scripts/served_path_driver.py there: the real vLLM Scheduler and connector
factory drive ActiveKV's connector (the shipped shim and its native core) and then the Python
reference connector (reference/vllm_connector.py) the same way, through multi-layer steps in
vLLM's hook order, counting first-party Python frames and code objects per step with
``sys.monitoring``.

It fails when a hook executes more than one first-party frame in the shim (or a frame nests in
another), when any first-party code other than the shim's hook methods runs (engine work in
Python), when a hook never reaches the connector, when the steps loaded or committed nothing, or
when the engine's plans and events differ from the reference's. It reports
"dispatch sites: reference N → engine M": distinct first-party code objects the steps ran.
Where no interpreter has vLLM, the verdict is "not-run" ("not run: vLLM not installed").
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
from pathlib import Path
from typing import Any

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
    "import sys, importlib.util, json; from packaging.tags import sys_tags\n"
    "ok = sys.version_info >= (3, 12) and importlib.util.find_spec('vllm') is not None\n"
    "print(json.dumps({'ok': ok, 'tags': [str(t) for t in sys_tags()] if ok else []}))"
)


def vllm_interpreter(explicit: Path | None = None) -> tuple[Path, list[str]] | None:
    """An interpreter (3.12+) that imports vLLM, with its wheel tags: `explicit`, else
    $ACTIVEKV_VLLM_PYTHON, else this one. None when none of them has vLLM."""
    env_python = os.environ.get("ACTIVEKV_VLLM_PYTHON")
    candidates = [explicit] if explicit else [Path(env_python)] if env_python else []
    candidates.append(Path(sys.executable))
    for python in candidates:
        try:
            result = subprocess.run(
                [str(python), "-c", _PROBE], capture_output=True, text=True, timeout=120
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if result.returncode == 0 and (probe := _probe_answer(result.stdout)) is not None:
            return python, probe
        if explicit is not None:
            detail = result.stderr.strip()[-300:] or "no vllm, or Python older than 3.12"
            raise GateError(
                f"--vllm-python {explicit}: expected Python 3.12+ that imports vllm (and "
                f"packaging); got {detail}"
            )
    return None


def _probe_answer(stdout: str) -> list[str] | None:
    """The wheel tags the probe printed last, when it found vLLM; None for no vLLM, or output
    that is not the probe's (a .pth or sitecustomize of that interpreter may print first)."""
    lines = stdout.strip().splitlines()
    try:
        probe = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if not isinstance(probe, dict) or probe.get("ok") is not True:
        return None
    tags = probe.get("tags")
    return tags if isinstance(tags, list) and all(isinstance(t, str) for t in tags) else None


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
    python: Path, wheel: Wheel, work: Path, layers: int, steps: int
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
        return judge(result)
    except (KeyError, TypeError, ValueError) as error:
        return [
            f"the driver's report lacks what the judgement reads ({error!r}); "
            f"{output_tail(run, _TAIL_LINES)}"
        ], {}


def run_served_path_gate(
    wheels: WheelSet,
    out_dir: Path,
    *,
    vllm_python: Path | None = None,
    layers: int = 4,
    steps: int = 6,
) -> Evidence:
    """Runs the driver on the wheel for vLLM's interpreter; writes and returns the evidence."""
    shim, shim_problems = shared_file(wheels)
    found = vllm_interpreter(vllm_python)
    if found is None:
        evidence = Evidence(
            gate="served-path",
            verdict="not-run",
            artefacts=wheels.digests,
            figures={"shared_file": shim},
            reason="not run: vLLM not installed (no Python 3.12+ with vllm: set "
            "ACTIVEKV_VLLM_PYTHON or pass --vllm-python)",
        )
        write_evidence(out_dir, evidence)
        return evidence
    python, tags = found
    wheel = wheel_for(wheels, tags)
    with (
        console.status(f"served path: driving {wheel.name} under vLLM with {python}"),
        tempfile.TemporaryDirectory(prefix="activekv-served-path-") as work,
    ):
        problems, figures = drive_and_judge(python, wheel, Path(work), layers, steps)
    problems += shim_problems
    # The verdict is on the shim, which every wheel carries byte for byte (shim_problems fail
    # otherwise): it holds for each of them, so the evidence names them all.
    evidence = Evidence(
        gate="served-path",
        verdict="fail" if problems else "pass",
        artefacts=wheels.digests,
        figures={**figures, "failures": problems, "shared_file": shim, "driven": wheel.name},
        reason="; ".join(problems),
        tools={"python": str(python)},
    )
    write_evidence(out_dir, evidence)
    return evidence


def dispatch_line(evidence: Evidence) -> str:
    sites = evidence.figures.get("dispatch_sites") or {}
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
        evidence = run_served_path_gate(
            inputs.wheels, inputs.out_dir, vllm_python=options.vllm_python,
            layers=options.layers, steps=options.steps,
        )  # fmt: skip
        if line := dispatch_line(evidence):
            console.print(line)
        return evidence


GATE = ServedPathGate()
