"""The payload gate (release/payload.py): every wheel member is classified; only allowed kinds ship.

The gate reads member names (and shim contents) only, so the native modules here are fake bytes.
Each negative control plants one violation and must fail the gate with the file named.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from release.digests import sha256_file
from release.evidence import evidence_path
from release.manifest import Manifest, load_manifest
from release.payload import classify, list_wheel, run_payload_gate

REAL = Path(__file__).resolve().parents[1] / "manifests" / "activekv.toml"
DIST_INFO = "activekv-0.1.0.dist-info"
SHIM_PATH = "activekv/connector.py"
SHIM_TEXT = b"from activekv._engine import Connector as ActiveKVConnector  # noqa: F401\n"

CLEAN = {
    "activekv/_engine.cpython-311-x86_64-linux-gnu.so": b"\x7fELF fake module",
    "activekv/_engine.pyi": b"def probe() -> int: ...\n",
    "activekv/py.typed": b"",
    f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\nName: activekv\nVersion: 0.1.0\n",
    f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n",
    f"{DIST_INFO}/RECORD": b"",
}


def make_wheel(directory: Path, extra: dict[str, bytes] | None = None, *, tag: str = "") -> Path:
    """A wheel holding the clean members plus `extra` (directory entries included, as real
    wheels built by zipfile tools may have them)."""
    directory.mkdir(parents=True, exist_ok=True)
    tag = tag or "cp311-cp311-manylinux_2_28_x86_64"
    path = directory / f"activekv-0.1.0-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("activekv/", b"")
        for name, data in {**CLEAN, **(extra or {})}.items():
            archive.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REAL)


def shim_manifest(tmp_path: Path, *, sha256: str, allow_shim: bool = True) -> Manifest:
    """The real manifest with one declared shim (and "shim" among the allowed kinds)."""
    text = REAL.read_text()
    kinds = 'allowed_kinds = ["extension", "stub", "typed-marker", "metadata"]'
    assert text.count(kinds) == 1 and text.count("shims = []\n") == 1
    if allow_shim:
        text = text.replace(kinds, kinds[:-1] + ', "shim"]')
    text = text.replace(
        "shims = []\n",
        "\n[[payload.shims]]\n"
        f'path = "{SHIM_PATH}"\n'
        'framework = "vllm"\n'
        'version = "0.33.0"\n'
        f'sha256 = "{sha256}"\n',
    )
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return load_manifest(path)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (f"{DIST_INFO}/METADATA", "metadata"),
        (f"{DIST_INFO}/entry_points.txt", "metadata"),
        ("activekv.libs/libfoo-1234abcd.so.1", "vendored-library"),
        ("activekv/_engine.cpython-311-x86_64-linux-gnu.so", "extension"),
        ("activekv/_engine.cpython-313t-x86_64-linux-gnu.so", "extension"),
        ("activekv/_engine.abi3.so", "extension"),
        ("activekv/_engine.pyi", "stub"),
        ("activekv/py.typed", "typed-marker"),
        ("activekv/connector.py", "python"),
        ("activekv/__init__.py", "python"),
        ("activekv/__pycache__/connector.cpython-311.pyc", "bytecode"),
        ("activekv/connector.pyc", "bytecode"),
        ("activekv/connector.pyo", "bytecode"),
        ("activekv/__pycache__/stale.txt", "bytecode"),
        ("activekv/LICENSE", "license"),
        ("activekv/license.txt", "license"),
        ("activekv/COPYING", "license"),
        ("activekv/NOTICE.md", "license"),
        ("activekv/libhelper.so", "other"),
        ("activekv/data.bin", "other"),
        ("activekv.pth", "other"),
    ],
)
def test_classify(path: str, kind: str) -> None:
    assert classify(path) == kind


def test_clean_native_wheel_passes(manifest: Manifest, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    listing = list_wheel(wheel, manifest)
    assert sorted(entry.path for entry in listing) == sorted(CLEAN)  # directories are skipped
    assert [entry for entry in listing if entry.problem] == []
    kinds = {entry.path: entry.kind for entry in listing}
    assert kinds["activekv/_engine.cpython-311-x86_64-linux-gnu.so"] == "extension"
    assert kinds["activekv/py.typed"] == "typed-marker"
    assert all(entry.wheel == wheel.name for entry in listing)

    evidence = run_payload_gate(manifest, [wheel], tmp_path / "out")
    assert evidence.verdict == "pass"
    assert evidence.reason == ""


@pytest.mark.parametrize(
    ("member", "why"),
    [
        ("activekv/connector.py", "undeclared Python file"),
        ("activekv/__init__.py", "undeclared Python file"),
        ("activekv/__pycache__/_engine.cpython-311.pyc", "bytecode may never ship"),
        ("activekv/connector.pyc", "bytecode may never ship"),
        ("activekv/data.bin", "kind 'other' is not in payload.allowed_kinds"),
        ("activekv.libs/libcudart-1234abcd.so.13", "kind 'vendored-library' is not in"),
        ("activekv/LICENSE", "kind 'license' is not in payload.allowed_kinds"),
        ("activekv-0.1.0.data/purelib/evil.py", "undeclared Python file"),
    ],
)
def test_planted_violation_fails_naming_the_file(
    manifest: Manifest, tmp_path: Path, member: str, why: str
) -> None:
    wheel = make_wheel(tmp_path, {member: b"x = 1\n"})
    bad = [entry for entry in list_wheel(wheel, manifest) if entry.problem]
    assert [entry.path for entry in bad] == [member]
    assert why in bad[0].problem

    evidence = run_payload_gate(manifest, [wheel], tmp_path / "out")
    assert evidence.verdict == "fail"
    assert f"{wheel.name}: {member}: " in evidence.reason
    assert evidence.figures["failures"] == [f"{wheel.name}: {member}: {bad[0].problem}"]


def test_declared_shim_with_the_declared_hash_passes(tmp_path: Path) -> None:
    manifest = shim_manifest(tmp_path, sha256=hashlib.sha256(SHIM_TEXT).hexdigest())
    wheel = make_wheel(tmp_path / "dist", {SHIM_PATH: SHIM_TEXT})
    listing = {entry.path: entry for entry in list_wheel(wheel, manifest)}
    assert listing[SHIM_PATH].kind == "shim"
    assert listing[SHIM_PATH].problem == ""
    assert run_payload_gate(manifest, [wheel], tmp_path / "out").verdict == "pass"


def test_declared_shim_with_other_content_fails(tmp_path: Path) -> None:
    declared = hashlib.sha256(SHIM_TEXT).hexdigest()
    manifest = shim_manifest(tmp_path, sha256=declared)
    tampered = SHIM_TEXT + b"import os; os.system('true')\n"
    wheel = make_wheel(tmp_path / "dist", {SHIM_PATH: tampered})
    evidence = run_payload_gate(manifest, [wheel], tmp_path / "out")
    assert evidence.verdict == "fail"
    assert f"{wheel.name}: {SHIM_PATH}: shim content sha256" in evidence.reason
    assert hashlib.sha256(tampered).hexdigest() in evidence.reason
    assert declared in evidence.reason


def test_declared_shim_fails_when_shims_are_not_an_allowed_kind(tmp_path: Path) -> None:
    manifest = shim_manifest(
        tmp_path, sha256=hashlib.sha256(SHIM_TEXT).hexdigest(), allow_shim=False
    )
    wheel = make_wheel(tmp_path / "dist", {SHIM_PATH: SHIM_TEXT})
    evidence = run_payload_gate(manifest, [wheel], tmp_path / "out")
    assert evidence.verdict == "fail"
    assert f"{SHIM_PATH}: kind 'shim' is not in payload.allowed_kinds" in evidence.reason


def test_a_declared_shim_path_does_not_allow_other_python(tmp_path: Path) -> None:
    manifest = shim_manifest(tmp_path, sha256=hashlib.sha256(SHIM_TEXT).hexdigest())
    wheel = make_wheel(tmp_path / "dist", {SHIM_PATH: SHIM_TEXT, "activekv/__init__.py": b""})
    evidence = run_payload_gate(manifest, [wheel], tmp_path / "out")
    assert evidence.verdict == "fail"
    assert evidence.figures["failures"] == [
        f"{wheel.name}: activekv/__init__.py: undeclared Python file "
        "(only the manifest's shims may ship)"
    ]


def test_evidence_file_names_every_wheel_digest_and_the_verdict(
    manifest: Manifest, tmp_path: Path
) -> None:
    good = make_wheel(tmp_path / "good", tag="cp311-cp311-manylinux_2_28_x86_64")
    bad = make_wheel(
        tmp_path / "bad", {"activekv/stray.py": b""}, tag="cp312-abi3-manylinux_2_28_x86_64"
    )
    out = tmp_path / "out"
    evidence = run_payload_gate(manifest, [good, bad], out)
    path = evidence_path(out, "payload")
    assert path == out / "evidence" / "payload.json"
    record = json.loads(path.read_text())
    assert record["gate"] == "payload"
    assert record["verdict"] == "fail" == evidence.verdict
    assert record["artefacts"] == {good.name: sha256_file(good), bad.name: sha256_file(bad)}
    assert record["reason"] == evidence.reason
    assert f"{bad.name}: activekv/stray.py:" in record["reason"]
    assert good.name not in record["reason"]
    listed = {(entry["wheel"], entry["path"]) for entry in record["figures"]["files"]}
    assert (good.name, "activekv/_engine.pyi") in listed
    assert (bad.name, "activekv/stray.py") in listed

    # A passing run replaces the record.
    run_payload_gate(manifest, [good], out)
    record = json.loads(path.read_text())
    assert record["verdict"] == "pass"
    assert record["artefacts"] == {good.name: sha256_file(good)}
