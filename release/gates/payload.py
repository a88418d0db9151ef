"""The payload gate (`python -m release payload` or `audit`): every file of every wheel is
classified; only the kinds the manifest allows may ship.

Executable Python is allowed only as a shim the manifest declares, with the declared content
hash, and every line of it must cite the source of each framework release it pins
(release/gates/citations.py), checked against each release's own wheel, fetched once into a cache
(release/util/framework_cache.py). Bytecode and undeclared `.py` files (a stray `__init__.py`
included) always fail. The SBOM the manifest requires (`payload.sbom`) must be there and tell the
truth about the wheel's modules (release/gates/sbom.py). The project's licence and the notice of
every library a module links statically must be there, named by METADATA
(release/gates/licenses.py).

The build's sdist, when the wheels come with one, is judged in the same run: it must hold
exactly the files it should (release/gates/payload_sdist.py). The evidence names it, with its
sha256, in its figures (``sdist``): its artefacts stay the wheels, which every other gate judges
too; signing and publishing take an sdist only where this gate's passing attestation names it.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath

from packaging.utils import parse_wheel_filename

from release.errors import GateError
from release.evidence import SDIST_FIGURE, Evidence, write_evidence
from release.gates.citations import verify_shim
from release.gates.contract import GateInputs, Judges, Runner
from release.gates.licenses import dist_info, licence_problems
from release.gates.payload_names import member_name_problem, path_spellings
from release.gates.payload_sdist import sdist_failures, sdist_figure
from release.gates.sbom import sbom_problems
from release.manifest import Manifest, Shim
from release.util.digests import sha256_file
from release.util.framework_cache import framework_wheel
from release.util.pins import project_version
from release.wheelset import WheelSet

_EXTENSION = re.compile(r"\.(cpython-\d+[a-z]*-[\w-]+|abi3)\.so$")


@dataclass(frozen=True)
class PayloadFile:
    wheel: str
    path: str
    kind: str
    size: int
    problem: str = ""


def classify(path: str) -> str:
    """The kind of one wheel member, from its path."""
    parts = PurePosixPath(path).parts
    if not parts:  # "" or "." (refused by name: member_name_problem)
        return "other"
    name = parts[-1]
    if parts[0].endswith(".dist-info"):
        return _dist_info_kind(parts[1:])
    if parts[0].endswith(".data") and len(parts) > 1:
        if parts[1] not in ("purelib", "platlib"):  # scripts, data, headers: installed elsewhere
            return f"data-{parts[1]}"
        parts = parts[2:]  # installed beside the package, so judged as if there
        if not parts:
            return "other"
    if name.endswith(".pth"):  # run by site at every interpreter start, wherever it lands
        return "path-config"
    if parts[0].endswith(".libs"):
        return "vendored-library"
    if _EXTENSION.search(name):
        return "extension"
    if name.endswith(".pyi"):
        return "stub"
    if name == "py.typed":
        return "typed-marker"
    if name.endswith(".py"):
        return "python"
    if name.endswith((".pyc", ".pyo")) or "__pycache__" in parts:
        return "bytecode"
    if name.upper().startswith(("LICENSE", "COPYING", "NOTICE")):
        return "license"
    return "other"


# What a wheel's .dist-info holds that installers read as metadata (PEP 427, 566, 639, 770).
_METADATA_FILES = frozenset({"METADATA", "WHEEL", "RECORD", "entry_points.txt"})


def _dist_info_kind(inside: tuple[str, ...]) -> str:
    """The kind of a member of the .dist-info folder (`inside`: its path below that folder):
    only the files installers read count as metadata; anything else (a .py, a .pth) is judged
    as what it is."""
    if len(inside) > 1 and inside[0] == "sboms":
        return "sbom"
    if len(inside) > 1 and inside[0] == "licenses":
        return "license"
    if len(inside) == 1 and inside[0] in _METADATA_FILES:
        return "metadata"
    return "other" if not inside else classify("/".join(("x", *inside)))


# (framework, version) -> the framework's wheel, whose files the citations name.
FrameworkSource = Callable[[str, str], Path]


def _shim_problem(shim: Shim, source: bytes, frameworks: FrameworkSource | None) -> str:
    actual = hashlib.sha256(source).hexdigest()
    if actual != shim.sha256:
        return f"shim content sha256 {actual} differs from the manifest's {shim.sha256}"
    pins = {pin.version: pin.sha256 for pin in shim.versions}
    if frameworks is None:
        cited = ", ".join(f"{shim.framework}=={version}" for version in pins)
        raise GateError(
            f"{shim.path}: its citations of {cited} need the framework's wheels; expected a "
            "framework cache directory (framework_cache)"
        )

    def fetch(version: str) -> Path:
        wheel = frameworks(shim.framework, version)
        if (pinned := pins[version]) and (found := sha256_file(wheel)) != pinned:
            raise GateError(f"{wheel}: expected the {shim.framework}=={version} wheel the "
                            f"manifest pins (versions sha256 {pinned}); got sha256 "
                            f"{found}")  # fmt: skip
        return wheel

    problems = verify_shim(shim.path, source, shim.framework, list(pins), fetch)
    return "; ".join(f"line {p.line}: {p.message}" for p in problems)


def list_wheel(
    wheel: Path, manifest: Manifest, frameworks: FrameworkSource | None = None
) -> list[PayloadFile]:
    """Every file of `wheel` with its kind, and the problem when it may not ship (a folder's
    entry is listed only when its name is refused)."""
    allowed = set(manifest.payload.allowed_kinds)
    shims = {shim.path: shim for shim in manifest.payload.shims}
    sbom = _sbom_member(wheel, manifest)
    listing: list[PayloadFile] = []
    with zipfile.ZipFile(wheel) as archive:
        names = [info.filename for info in archive.infolist()]
        counts, spellings = Counter(names), path_spellings(names)
        licences = licence_problems(archive, wheel.name, sbom)
        for info in archive.infolist():
            kind = "directory" if info.is_dir() else classify(info.filename)
            name = info.filename
            problem = member_name_problem(name, counts[name], spellings)
            if kind == "directory" and not problem:
                continue
            if not problem and kind in ("python", "bytecode", "sbom"):
                kind, problem = _content_problem(
                    archive, info, kind, wheel.name, shims, sbom, frameworks
                )
            if not problem and kind not in allowed:
                problem = f"kind {kind!r} is not in payload.allowed_kinds {sorted(allowed)}"
            if not problem and kind == "license":
                problem = _licence_place_problem(wheel.name, name)
            problem = problem or licences.pop(name, "")
            listing.append(PayloadFile(wheel.name, info.filename, kind, info.file_size, problem))
        if sbom and sbom not in archive.namelist():
            missing = "missing: every wheel carries its SBOM here (payload.sbom, PEP 770)"
            listing.append(PayloadFile(wheel.name, sbom, "sbom", 0, missing))
        # What is missing: a licence file, or METADATA itself.
        listing += [
            PayloadFile(wheel.name, path, classify(path), 0, problem)
            for path, problem in licences.items()
            if path not in counts
        ]
    return listing


def _licence_place_problem(wheel_name: str, name: str) -> str:
    """A licence file belongs in the .dist-info's licenses/ (PEP 639), where METADATA names it."""
    folder = f"{dist_info(wheel_name)}/licenses/"
    if name.startswith(folder):
        return ""
    return (
        f"a licence file outside {folder}; expected it there, named by a License-File line of "
        "METADATA (PEP 639)"
    )


def _content_problem(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    kind: str,
    wheel_name: str,
    shims: dict[str, Shim],
    sbom: str,
    frameworks: FrameworkSource | None,
) -> tuple[str, str]:
    """The kind (a declared shim's is "shim") and problem of a Python, bytecode or SBOM member."""
    if kind == "bytecode":
        return kind, "compiled Python bytecode may never ship"
    if kind == "sbom":
        return kind, _sbom_problem(archive, info.filename, sbom, wheel_name)
    shim = shims.get(info.filename)
    if shim is None:
        return kind, "undeclared Python file (only the manifest's shims may ship)"
    return "shim", _shim_problem(shim, archive.read(info), frameworks)


def _sbom_problem(archive: zipfile.ZipFile, member: str, sbom: str, wheel_name: str) -> str:
    """The manifest's SBOM judged against the wheel; any other SBOM is refused unread."""
    if member == sbom:
        return "; ".join(sbom_problems(archive, member, wheel_name))
    if not sbom:
        return "an SBOM the manifest does not ask for; expected none (payload.sbom is unset)"
    return f"an SBOM the manifest does not name; expected only {sbom} (payload.sbom)"


def _sbom_member(wheel: Path, manifest: Manifest) -> str:
    """Where the wheel must hold the manifest's SBOM; empty when none is required."""
    if manifest.payload.sbom is None:
        return ""
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return f"{name}-{version}.dist-info/sboms/{manifest.payload.sbom}"


def run_payload_gate(
    manifest: Manifest,
    wheels: WheelSet,
    out_dir: Path,
    *,
    framework_cache: Path | None = None,
    pip_args: Sequence[str] = (),
    source_dir: Path | None = None,
) -> Evidence:
    """Lists every wheel, and the sdist of `wheels` if they carry one (against the checkout
    `source_dir` it was built from), writes the payload evidence, and returns it (verdict pass
    or fail).

    Shim citations are checked against framework wheels kept under `framework_cache`, fetched
    with `pip download --no-deps` (plus `pip_args`) when missing."""
    frameworks: FrameworkSource | None = None
    if framework_cache is not None:
        frameworks = partial(framework_wheel, cache_dir=framework_cache, pip_args=pip_args)
    listing = [entry for wheel in wheels for entry in list_wheel(wheel.path, manifest, frameworks)]
    failures = [f"{e.wheel}: {e.path}: {e.problem}" for e in listing if e.problem]
    figures: dict[str, object] = {"files": [entry.__dict__ for entry in listing]}
    if wheels.sdist is not None:
        if source_dir is None:
            raise GateError(f"{wheels.sdist.path}: expected the checkout the sdist was built "
                            "from (source_dir), to list the files it must hold")  # fmt: skip
        figures[SDIST_FIGURE] = sdist_figure(wheels.sdist, source_dir, manifest.release.name,
                                             project_version())  # fmt: skip
        failures += sdist_failures(figures)
    evidence = Evidence(
        gate="payload",
        verdict="fail" if failures else "pass",
        artefacts=wheels.digests,
        figures={**figures, "failures": failures},
        reason="; ".join(failures),
    )
    write_evidence(out_dir, evidence)
    return evidence


class PayloadGate:
    name = "payload"
    runner: Runner = "cpu"
    judges = Judges.EVERY_WHEEL
    shared_file = None

    def run(self, inputs: GateInputs) -> Evidence:
        return run_payload_gate(
            inputs.manifest, inputs.wheels, inputs.out_dir, framework_cache=inputs.cache_dir,
            source_dir=inputs.source_dir,
        )  # fmt: skip


GATE = PayloadGate()
