"""The casters gate (`python -m release casters`): no bound signature names a raw C++ type.

nanobind writes a C++ type it has no caster for into the signature as its C++ name (e.g.
``std::set<long, ...>`` or ``activekv::offload::Lease``); such a function imports fine and fails
only when called. The gate installs each wheel with the interpreter it serves, imports every
native module from there, reads the ``__nb_signature__`` of every function, method and property
(release/scripts/caster_scan.py) and fails naming each function whose signature holds a C++ name.

The scanner runs with ``-I -S`` (no site-packages: the wheel's ``activekv`` is a namespace
package, which a regular one anywhere on the path would replace) and writes its result to a report
file, never stdout (an imported module may print to it). The gate fails, quoting the scanner's
output, when that report is missing or unreadable, when a native module of the wheel is not in
it, or when one was imported from outside the install folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from release.errors import GateError
from release.evidence import Evidence, write_evidence
from release.gates.child_report import output_tail, read_child_report
from release.gates.contract import GateInputs, Judges, Runner
from release.gates.payload import classify
from release.util.interpreters import find_interpreter
from release.util.paths import script
from release.util.private_site import clean_pip_env, install_private
from release.wheelset import WheelSet

SCANNER = script("caster_scan")
# A C++ scope (`std::`, `activekv::offload::`) never appears in a Python annotation.
_RAW_CPP = re.compile(r"(?:\(anonymous namespace\)|\b[A-Za-z_]\w*)(?:::[A-Za-z_]\w*)+")


@dataclass(frozen=True)
class MissingCaster:
    wheel: str
    function: str
    signature: str
    raw: str

    def __str__(self) -> str:
        return f"{self.wheel}: {self.function}: raw C++ type {self.raw!r} in `{self.signature}`"


def raw_cpp_names(signature: str) -> list[str]:
    """The C++ type names in one nanobind signature (empty when every type has a caster)."""
    return [match.group(0).strip() for match in _RAW_CPP.finditer(signature)]


def missing_casters(wheel: str, scanned: list[dict[str, object]]) -> list[MissingCaster]:
    """Every (function, raw C++ name) of the scanner's output."""
    missing: list[MissingCaster] = []
    for entry in scanned:
        signatures = entry["signatures"]
        assert isinstance(signatures, list)
        for signature in signatures:
            for raw in raw_cpp_names(str(signature)):
                missing.append(MissingCaster(wheel, str(entry["name"]), str(signature), raw))
    return missing


def native_modules(wheel: Path) -> list[str]:
    """Import names of the wheel's extension modules, e.g. ``activekv._engine``."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if classify(n) == "extension"]
    modules = []
    for name in names:
        path = PurePosixPath(name)
        modules.append(".".join((*path.parts[:-1], path.name.split(".")[0])))
    return sorted(modules)


class ScanError(Exception):
    """The scan of one wheel gave no verdict: the scanner failed, wrote no report, or the report
    does not cover the wheel's native modules as installed."""


_TAIL_LINES = 5  # of the scanner's output, quoted in a failure


def read_report(report: Path, result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The scanner's report: a JSON object with a list of modules; ScanError quoting the child's
    output when it is missing or is not that."""
    loaded = read_child_report(report, result, "scanner", ScanError, _TAIL_LINES)
    if not isinstance(loaded, dict) or not isinstance(loaded.get("modules"), list):
        raise ScanError(
            f'expected a report {{"flags": ..., "modules": [...]}} from the scanner, got '
            f"{str(loaded)[:200]!r}; {output_tail(result, _TAIL_LINES)}"
        )
    return loaded


def coverage_problems(report: dict[str, Any], site: Path, expected: list[str]) -> list[str]:
    """What keeps `report` from judging the wheel installed in `site`: a scanner run with the
    interpreter's site-packages, a native module of the wheel not scanned, or one imported from
    outside `site` (another ``activekv`` on the path)."""
    problems: list[str] = []
    flags = report.get("flags") or {}
    if not (flags.get("isolated") and flags.get("no_site")):
        problems.append(
            f"expected the scanner to run isolated, without site (-I -S); flags {flags}"
        )
    root = Path(os.path.realpath(site))
    scanned = {str(m.get("name")): m for m in report["modules"] if isinstance(m, dict)}
    for name in expected:
        module = scanned.get(name)
        if module is None:
            problems.append(f"{name}: in the wheel, not in the scanner's report")
            continue
        file = module.get("file")
        if not isinstance(file, str) or not Path(os.path.realpath(file)).is_relative_to(root):
            problems.append(f"{name}: imported from {file}, expected a file under {root}")
    problems += [f"{name}: scanned, not a native module of the wheel" for name in
                 sorted(set(scanned) - set(expected))]  # fmt: skip
    return problems


def scan_wheel(wheel: Path, python: Path, work: Path) -> list[dict[str, object]]:
    """Installs `wheel` with `python` into `work` and lists every bound signature of its modules;
    ScanError unless every native module of the wheel was scanned from where it was installed."""
    site = install_private(python, wheel, work / "site")
    report = work / "caster-scan.json"
    modules = native_modules(wheel)
    result = subprocess.run(
        [str(python), "-I", "-S", str(SCANNER), "--report", str(report), "--site", str(site),
         *modules],
        env=clean_pip_env(), capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        tail = " ".join(result.stderr.strip().splitlines()[-3:])
        raise ScanError(f"importing the native modules of {wheel.name} failed: {tail}")
    loaded = read_report(report, result)
    if problems := coverage_problems(loaded, site, modules):
        raise ScanError(
            f"the scan does not judge {wheel.name}: {'; '.join(problems)}; "
            f"{output_tail(result, _TAIL_LINES)}"
        )
    return [entry for module in loaded["modules"] for entry in module.get("entries", [])]


def run_casters_gate(
    wheels: WheelSet,
    out_dir: Path,
    *,
    find_python: Callable[[str], Path | None] = find_interpreter,
) -> Evidence:
    """Scans every wheel with its own interpreter; writes and returns the casters evidence."""
    figures: dict[str, object] = {}
    problems: list[str] = []
    unjudged: list[str] = []
    for wheel in wheels:
        version = wheel.python
        python = find_python(version)
        if python is None:
            unjudged.append(f"{wheel.name}: no python{version} to import it with")
            continue
        with tempfile.TemporaryDirectory(prefix="activekv-casters-") as work:
            try:
                scanned = scan_wheel(wheel.path, python, Path(work))
            except (ScanError, GateError, subprocess.CalledProcessError) as error:
                detail = getattr(error, "stderr", "") or str(error)
                problems.append(f"{wheel.name}: {detail.strip()}")
                continue
        missing = missing_casters(wheel.name, scanned)
        problems += [str(m) for m in missing]
        figures[wheel.name] = {
            "python": version,
            "modules": native_modules(wheel.path),
            "signatures": sum(len(entry["signatures"]) for entry in scanned),  # type: ignore[arg-type]
            "missing": [m.function for m in missing],
        }
    verdict = "fail" if problems else "not-run" if unjudged else "pass"
    evidence = Evidence(
        gate="casters",
        verdict=verdict,
        artefacts=wheels.digests,
        figures={"wheels": figures, "failures": problems},
        reason="; ".join(problems or [f"not run: {u}" for u in unjudged]),
    )
    write_evidence(out_dir, evidence)
    return evidence


class CastersGate:
    name = "casters"
    runner: Runner = "cpu"
    judges = Judges.EVERY_WHEEL_IN_ITS_INTERPRETER
    shared_file = None

    def run(self, inputs: GateInputs) -> Evidence:
        return run_casters_gate(inputs.wheels, inputs.out_dir)


GATE = CastersGate()
