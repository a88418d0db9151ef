"""What a wheel owes the licences of its code (PEP 639): the project's licence, and the notice of
every library a native module links in statically, each under `<dist-info>/licenses/` and named
by a `License-File` line of METADATA, with the text the checkout commits.

The payload gate (release/gates/payload.py) calls :func:`licence_problems` for every wheel. Which
libraries a wheel links statically is read twice, independently: from each module's own facts and
DT_NEEDED entries (release/gates/sbom_facts.py), and from what the wheel's SBOM says (its
components whose `activekv:linkage` is `static`); a library either names needs its notice.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

from packaging.metadata import RawMetadata, parse_email
from packaging.utils import parse_wheel_filename

from release.errors import GateError
from release.gates.sbom_facts import (
    FactError,
    expected_components,
    expected_linkage,
    module_facts,
    module_needed,
)
from release.util.paths import REPO_ROOT

# The project's licence (pyproject.toml's project.license-files takes it into every wheel).
PROJECT_LICENSE = "LICENSE"
# The notice each library a module may link statically needs beside it (NOTICE lists them): the
# licence text of the version linked, committed under LICENSES/ (tests/test_license_texts.py
# keeps each equal to the pinned package's own file). libstdc++ needs none: the GCC Runtime
# Library Exception 3.1 lets code compiled with it ship under any terms, with no notice.
NOTICES: dict[str, str] = {
    "libc++": "LICENSES/libcxx.txt",
    "libc++abi": "LICENSES/libcxxabi.txt",
    "libunwind": "LICENSES/libunwind.txt",
    "nanobind": "LICENSES/nanobind.txt",
    "robin-map": "LICENSES/robin-map.txt",
    "cudart": "LICENSES/cudart.txt",
}
NO_NOTICE = frozenset({"libstdc++"})


def dist_info(wheel_name: str) -> str:
    """The wheel's .dist-info folder, as its file name spells it (PEP 427)."""
    name, version, _, _ = parse_wheel_filename(wheel_name)
    return f"{str(name).replace('-', '_')}-{version}.dist-info"


def read_metadata(archive: zipfile.ZipFile, wheel_name: str) -> RawMetadata | None:
    """The wheel's METADATA fields as packaging reads them; None when it holds none."""
    member = f"{dist_info(wheel_name)}/METADATA"
    if member not in archive.namelist():
        return None
    raw, _ = parse_email(archive.read(member))
    return raw


def licence_problems(archive: zipfile.ZipFile, wheel_name: str, sbom: str) -> dict[str, str]:
    """Member path -> what is wrong with it, for the wheel's licence files and METADATA's
    licence fields (`sbom`: the member holding the wheel's SBOM, or empty)."""
    folder = dist_info(wheel_name)
    metadata = read_metadata(archive, wheel_name)
    if metadata is None:
        return {f"{folder}/METADATA": "missing: expected METADATA, which names the licence"}
    problems: dict[str, str] = {}
    if not metadata.get("license_expression"):
        problems[f"{folder}/METADATA"] = (
            "License-Expression: expected the SPDX expression of the package's licence "
            "(PEP 639); got none"
        )
    prefix = f"{folder}/licenses/"
    present = {
        name.removeprefix(prefix): name
        for name in archive.namelist()
        if name.startswith(prefix) and not name.endswith("/")
    }
    listed = metadata.get("license_files", [])
    for entry in sorted(set(listed) - set(present)):
        problems[prefix + entry] = (
            "missing: METADATA names it in a License-File line; expected the file (PEP 639)"
        )
    for entry in sorted(set(present) - set(listed)):
        problems[present[entry]] = (
            "METADATA names it in no License-File line; expected every file under licenses/ "
            "named (PEP 639)"
        )
    required = {PROJECT_LICENSE: "the project's licence"}
    for component, where in sorted(static_components(archive, sbom).items()):
        if component in NOTICES:
            required.setdefault(
                NOTICES[component], f"the notice of {component}, which {where} links statically"
            )
    for path, why in required.items():
        member = prefix + path
        if path not in present:
            problems[member] = f"missing: {why}; expected the checkout's {path} here (NOTICE)"
        elif problem := _text_problem(archive.read(member), path, why):
            problems.setdefault(member, problem)
    return problems


def _text_problem(data: bytes, path: str, why: str) -> str:
    """Why the wheel's copy of the checkout's licence file `path` is not that text; empty when
    it is."""
    committed = REPO_ROOT / path
    try:
        expected = committed.read_bytes()
    except OSError as error:
        raise GateError(
            f"{committed}: expected the committed text of {why}; cannot read it ({error.strerror})"
        ) from None
    if data == expected:
        return ""
    return (
        f"expected the text of the checkout's {path} ({why}), sha256 "
        f"{hashlib.sha256(expected).hexdigest()}; got sha256 {hashlib.sha256(data).hexdigest()}"
    )


def static_components(archive: zipfile.ZipFile, sbom: str) -> dict[str, str]:
    """Each library linked in statically -> a module, or the SBOM, that says so."""
    found: dict[str, str] = {}
    for info in archive.infolist():
        if info.filename.endswith(".so"):
            for component in _module_static(archive.read(info)):
                found.setdefault(component, info.filename)
    for component in _sbom_static(archive, sbom):
        found.setdefault(component, f"the SBOM ({sbom})")
    return found


def _module_static(data: bytes) -> list[str]:
    """The libraries a module's facts say it carries and its DT_NEEDED does not load; none when
    they cannot be read (the SBOM gate names that)."""
    try:
        facts, needed = module_facts(data), module_needed(data)
    except FactError:
        return []
    return [c for c in expected_components(facts) if expected_linkage(c, needed) == "static"]


def _sbom_static(archive: zipfile.ZipFile, sbom: str) -> list[str]:
    """The components the SBOM lists as `activekv:linkage` static; none when it cannot be read
    (the SBOM gate names that)."""
    if not sbom or sbom not in archive.namelist():
        return []
    try:
        document: Any = json.loads(archive.read(sbom))
        components = document.get("components", [])
        return [
            str(component.get("name"))
            for component in components
            if {"name": "activekv:linkage", "value": "static"} in component.get("properties", [])
        ]
    except (ValueError, AttributeError, TypeError, RecursionError):
        return []


def committed_notices() -> dict[str, Path]:
    """The checkout's licence files the wheels take: the project's and every notice."""
    paths = [PROJECT_LICENSE, *NOTICES.values()]
    return {path: REPO_ROOT / path for path in paths}
