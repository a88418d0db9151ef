"""The payload gate: every file of every wheel is classified; only allowed kinds may ship.

Executable Python is allowed only as a shim the manifest declares, with the declared content
hash. Bytecode and undeclared `.py` files (a stray `__init__.py` included) always fail.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from release.digests import sha256_file
from release.evidence import Evidence, write_evidence
from release.manifest import Manifest

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
    name = parts[-1]
    if parts[0].endswith(".dist-info"):
        return "metadata"
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


def list_wheel(wheel: Path, manifest: Manifest) -> list[PayloadFile]:
    """Every file of `wheel` with its kind, and the problem when it may not ship."""
    allowed = set(manifest.payload.allowed_kinds)
    shims = {shim.path: shim for shim in manifest.payload.shims}
    listing: list[PayloadFile] = []
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            kind = classify(info.filename)
            problem = ""
            if kind == "python":
                shim = shims.get(info.filename)
                if shim is None:
                    problem = "undeclared Python file (only the manifest's shims may ship)"
                else:
                    kind = "shim"
                    actual = hashlib.sha256(archive.read(info)).hexdigest()
                    if actual != shim.sha256:
                        problem = (
                            f"shim content sha256 {actual} differs from the manifest's "
                            f"{shim.sha256}"
                        )
            elif kind == "bytecode":
                problem = "compiled Python bytecode may never ship"
            if not problem and kind not in allowed:
                problem = f"kind {kind!r} is not in payload.allowed_kinds {sorted(allowed)}"
            listing.append(PayloadFile(wheel.name, info.filename, kind, info.file_size, problem))
    return listing


def run_payload_gate(manifest: Manifest, wheels: Sequence[Path], out_dir: Path) -> Evidence:
    """Lists every wheel, writes the payload evidence, and returns it (verdict pass or fail)."""
    listing = [entry for wheel in wheels for entry in list_wheel(wheel, manifest)]
    failures = [entry for entry in listing if entry.problem]
    evidence = Evidence(
        gate="payload",
        verdict="fail" if failures else "pass",
        artefacts={wheel.name: sha256_file(wheel) for wheel in wheels},
        figures={
            "files": [entry.__dict__ for entry in listing],
            "failures": [f"{e.wheel}: {e.path}: {e.problem}" for e in failures],
        },
        reason="; ".join(f"{e.wheel}: {e.path}: {e.problem}" for e in failures),
    )
    write_evidence(out_dir, evidence)
    return evidence
