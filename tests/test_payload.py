"""The payload gate (release/gates/payload.py): every wheel member is classified; only allowed
kinds ship.

The gate reads member names (and shim contents) only, so the native modules here are fake bytes.
Each negative control plants one violation and must fail the gate with the file named.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest
from fixtures_wheels import FAKEFW_FILES, build_files_wheel, fakefw_cite, fakefw_shim, wheel_set

from release.errors import GateError
from release.evidence import Evidence, evidence_path
from release.gates.payload import classify, list_wheel, run_payload_gate
from release.manifest import Manifest, load_manifest
from release.util.digests import sha256_file
from release.util.paths import REFERENCE_DIR

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "manifests" / "activekv.toml"
DIST_INFO = "activekv-0.1.0.dist-info"
# Every wheel carries the project's licence, named by METADATA (release/gates/licenses.py).
LICENSE_MEMBER = f"{DIST_INFO}/licenses/LICENSE"
METADATA_TEXT = (
    b"Metadata-Version: 2.4\nName: activekv\nVersion: 0.1.0\n"
    b"License-Expression: Apache-2.0\nLicense-File: LICENSE\n"
)
SHIM_PATH = "activekv/connector.py"
CITED_RETURN = f"        return x  {fakefw_cite('fakefw/caller.py', 2)}\n".encode()
SHIM_TEXT = fakefw_shim()
assert SHIM_TEXT.endswith(CITED_RETURN)

CLEAN = {
    "activekv/_engine.cpython-311-x86_64-linux-gnu.so": b"\x7fELF fake module",
    "activekv/_engine.pyi": b"def probe() -> int: ...\n",
    "activekv/py.typed": b"",
    f"{DIST_INFO}/METADATA": METADATA_TEXT,
    LICENSE_MEMBER: (REPO / "LICENSE").read_bytes(),
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


def without_sbom(manifest: Manifest) -> Manifest:
    """The fake modules here record no SBOM facts; tests/test_sbom.py judges real wheels' SBOMs.
    Licence files are among the allowed kinds (every wheel carries its licence)."""
    kinds = tuple(dict.fromkeys([*manifest.payload.allowed_kinds, "license"]))
    payload = manifest.payload.model_copy(update={"sbom": None, "allowed_kinds": kinds})
    return manifest.model_copy(update={"payload": payload})


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return without_sbom(load_manifest(REAL))


# The manifest's one [[payload.shims]] table, up to the end of its versions array.
SHIMS = re.compile(r"^\[\[payload\.shims\]\]\n(?:.*\n)*?\]\n", re.MULTILINE)


def shim_manifest(
    tmp_path: Path,
    *,
    sha256: str,
    allow_shim: bool = True,
    framework: str = "vllm",
    version: str = "0.33.0",
    framework_sha256: str | None = None,
) -> Manifest:
    """The real manifest with one declared shim (and "shim" among the allowed kinds or not)."""
    text = REAL.read_text()
    kinds = re.findall(r"^allowed_kinds = \[.*\]$", text, re.MULTILINE)[0]
    assert text.count(kinds) == 1 and ', "shim"' in kinds and len(SHIMS.findall(text)) == 1
    if not allow_shim:
        text = text.replace(kinds, kinds.replace(', "shim"', ""))
    pin = f'{{ version = "{version}"' + (
        f', sha256 = "{framework_sha256}" }}' if framework_sha256 else " }"
    )
    entry = (
        f'[[payload.shims]]\npath = "{SHIM_PATH}"\nframework = "{framework}"\n'
        f'supports = "=={version}"\nversions = [{pin}]\nsha256 = "{sha256}"\n'
    )
    text = SHIMS.sub(entry, text)
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return without_sbom(load_manifest(path))


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (f"{DIST_INFO}/METADATA", "metadata"),
        (f"{DIST_INFO}/entry_points.txt", "metadata"),
        (f"{DIST_INFO}/sboms/activekv.cdx.json", "sbom"),
        (f"{DIST_INFO}/sboms/auditwheel.cdx.json", "sbom"),
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
        ("activekv.pth", "path-config"),
        # What is installed and run, wherever it hides: never metadata.
        ("activekv/evil.pth", "path-config"),
        (f"{DIST_INFO}/evil.pth", "path-config"),
        (f"{DIST_INFO}/hook.py", "python"),
        (f"{DIST_INFO}/__pycache__/hook.cpython-311.pyc", "bytecode"),
        (f"{DIST_INFO}/notes.txt", "other"),
        (f"{DIST_INFO}/licenses/LICENSE", "license"),
        ("activekv-0.1.0.data/scripts/activekv-tool.pyi", "data-scripts"),
        ("activekv-0.1.0.data/scripts/py.typed", "data-scripts"),
        ("activekv-0.1.0.data/data/share/x.pyi", "data-data"),
        ("activekv-0.1.0.data/headers/x.h", "data-headers"),
        ("activekv-0.1.0.data/purelib/activekv/x.py", "python"),
        ("activekv-0.1.0.data/platlib/activekv/_x.abi3.so", "extension"),
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

    evidence = run_payload_gate(manifest, wheel_set(wheel), tmp_path / "out")
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
        ("activekv/LICENSE", f"a licence file outside {DIST_INFO}/licenses/; expected it"),
        ("activekv-0.1.0.data/purelib/evil.py", "undeclared Python file"),
        # names an installer resolves elsewhere than the gate judged them (an SBOM over the SBOM)
        (f"{DIST_INFO}/sboms/x/../activekv.cdx.json", "the name has a '..' part; expected"),
        (f"{DIST_INFO}/sboms/./activekv.cdx.json", "the name has a '.' part; expected"),
        (f"{DIST_INFO}/sboms//activekv.cdx.json", "the name has an empty part; expected"),
        ("activekv/../activekv/_engine.pyi", "the name has a '..' part; expected"),
        ("activekv/x/../", "the name has a '..' part; expected"),  # a folder's entry too
        ("/activekv/_engine.pyi", "the name is absolute; expected a path relative"),
        ("activekv\\_engine.pyi", "the name holds a backslash; expected '/'"),
        ("activekv/_engine.pyi\n", "invisible or control character (U+000A); expected printable"),
        # HFS+ ignores zero-width characters when it compares names; a bidi override makes a
        # name read as another
        ("activekv/_engine\u200c.pyi", "invisible or control character (U+200C)"),
        ("activekv/x\u202eiyp.so", "invisible or control character (U+202E)"),
        ("activekv/a\u2028b.pyi", "invisible or control character (U+2028)"),
        # an SBOM no manifest asks for is never judged, so never shipped
        (f"{DIST_INFO}/sboms/other.cdx.json", "an SBOM the manifest does not ask for; expected"),
    ],
)
def test_planted_violation_fails_naming_the_file(
    manifest: Manifest, tmp_path: Path, member: str, why: str
) -> None:
    wheel = make_wheel(tmp_path, {member: b"x = 1\n"})
    bad = [entry for entry in list_wheel(wheel, manifest) if entry.problem]
    assert [entry.path for entry in bad] == [member]
    assert why in bad[0].problem

    evidence = run_payload_gate(manifest, wheel_set(wheel), tmp_path / "out")
    assert evidence.verdict == "fail"
    assert f"{wheel.name}: {member}: " in evidence.reason
    assert evidence.figures["failures"] == [f"{wheel.name}: {member}: {bad[0].problem}"]


def test_two_members_of_one_name_fail_both(manifest: Manifest, tmp_path: Path) -> None:
    """A zip may hold two entries of one name: the gate would judge one, an installer keep the
    other."""
    wheel = make_wheel(tmp_path)
    with zipfile.ZipFile(wheel, "a") as archive, pytest.warns(UserWarning, match="Duplicate"):
        archive.writestr("activekv/_engine.pyi", b"import os\n")
    bad = [(entry.path, entry.problem) for entry in list_wheel(wheel, manifest) if entry.problem]
    problem = "the wheel holds 2 members of this name; expected one (installers keep one)"
    assert bad == [("activekv/_engine.pyi", problem)] * 2


@pytest.mark.parametrize(
    ("twin", "why"),
    [
        # one file on a case-insensitive filesystem
        ("activekv/_Engine.pyi", "spelled 2 ways in the wheel (['activekv/_Engine.pyi', 'activ"),
        # the folder above differs in case only: both folders merge, and so would their files
        ("ACTIVEKV/other.pyi", "spelled 2 ways in the wheel (['ACTIVEKV', 'activekv']), which"),
        # a folder's entry of the file's name, or a file inside it: both cannot exist
        ("activekv/_engine.pyi/", "'activekv/_engine.pyi' is a file and a folder in the wheel"),
        ("activekv/_engine.pyi/x", "'activekv/_engine.pyi' is a file and a folder in the wheel"),
    ],
)
def test_names_one_filesystem_takes_for_one_fail_both(
    manifest: Manifest, tmp_path: Path, twin: str, why: str
) -> None:
    """A case-insensitive filesystem keeps one of two names that differ only in case: which one
    is the installer's choice, not the gate's. Every member under a clashing folder fails."""
    wheel = make_wheel(tmp_path, {twin: b""})
    bad = {entry.path: entry.problem for entry in list_wheel(wheel, manifest) if entry.problem}
    assert {"activekv/_engine.pyi", twin} <= set(bad)
    assert all(why in problem for problem in bad.values()), bad


def test_names_that_normalise_to_one_fail_both(manifest: Manifest, tmp_path: Path) -> None:
    """macOS and a normalising filesystem store "é" and "e" + combining acute as one name."""
    composed, decomposed = "activekv/caf\u00e9.pyi", "activekv/cafe\u0301.pyi"
    wheel = make_wheel(tmp_path, {composed: b"", decomposed: b""})
    bad = {entry.path for entry in list_wheel(wheel, manifest) if entry.problem}
    assert bad == {composed, decomposed}


@pytest.fixture(scope="module")
def fakefw(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """pip arguments that find the fixture framework ``fakefw==1.0`` (and nothing else)."""
    index = tmp_path_factory.mktemp("index")
    build_files_wheel(index, FAKEFW_FILES)
    return ["--no-index", "--find-links", str(index)]


@pytest.fixture(autouse=True)
def plain_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # this machine's pip config adds sources
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


def audit(
    tmp_path: Path, fakefw: list[str], members: dict[str, bytes], **manifest_args: object
) -> tuple[Path, Evidence]:
    """The payload gate on one wheel with `members`, the fakefw shim declared."""
    manifest_args.setdefault("sha256", hashlib.sha256(members.get(SHIM_PATH, b"")).hexdigest())
    manifest = shim_manifest(tmp_path, framework="fakefw", version="1.0", **manifest_args)  # type: ignore[arg-type]
    wheel = make_wheel(tmp_path / "dist", members)
    evidence = run_payload_gate(
        manifest,
        wheel_set(wheel),
        tmp_path / "out",
        framework_cache=tmp_path / "cache",
        pip_args=fakefw,
    )
    return wheel, evidence


def test_declared_cited_shim_passes_and_fetches_the_framework_once(
    tmp_path: Path, fakefw: list[str]
) -> None:
    wheel, evidence = audit(tmp_path, fakefw, {SHIM_PATH: SHIM_TEXT})
    assert evidence.verdict == "pass", evidence.reason
    shim = [f for f in evidence.figures["files"] if f["path"] == SHIM_PATH]
    assert shim == [{"wheel": wheel.name, "path": SHIM_PATH, "kind": "shim",
                     "size": len(SHIM_TEXT), "problem": ""}]  # fmt: skip
    assert [p.name for p in (tmp_path / "cache" / "frameworks").iterdir()] == [
        "fakefw-1.0-py3-none-any.whl"
    ]


def test_a_framework_wheel_other_than_the_pinned_one_is_refused(
    tmp_path: Path, fakefw: list[str]
) -> None:
    """A wheel of the framework's name and version that is not the one pinned (another build, a
    hand-made stand-in in the cache) cannot be what citations are checked against."""
    (pinned,) = Path(fakefw[-1]).glob("*.whl")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    digest = hashlib.sha256(pinned.read_bytes()).hexdigest()
    _, evidence = audit(tmp_path / "a", fakefw, {SHIM_PATH: SHIM_TEXT}, framework_sha256=digest)
    assert evidence.verdict == "pass", evidence.reason
    with pytest.raises(GateError, match=r"expected the fakefw==1\.0 wheel the manifest pins"):
        audit(tmp_path / "b", fakefw, {SHIM_PATH: SHIM_TEXT}, framework_sha256="0" * 64)


def test_declared_shim_with_other_content_fails(tmp_path: Path, fakefw: list[str]) -> None:
    declared = hashlib.sha256(SHIM_TEXT).hexdigest()
    tampered = SHIM_TEXT + b"import os; os.system('true')\n"
    wheel, evidence = audit(tmp_path, fakefw, {SHIM_PATH: tampered}, sha256=declared)
    assert evidence.verdict == "fail"
    assert f"{wheel.name}: {SHIM_PATH}: shim content sha256" in evidence.reason
    assert hashlib.sha256(tampered).hexdigest() in evidence.reason
    assert declared in evidence.reason


@pytest.mark.parametrize(
    ("replace", "expected"),
    [
        pytest.param(
            (CITED_RETURN, b"        return x\n"),
            "line 6: uncited line: expected '# cites: ",
            id="uncited-line",
        ),
        pytest.param(
            (b"fakefw/caller.py:2 ", b"fakefw/caller.py:1 "),
            "line 6: cites fakefw/caller.py:1 with hash",
            id="wrong-line-number",
        ),
        pytest.param(
            (b"fakefw==1.0 fakefw/base.py:3", b"fakefw==1.1 fakefw/base.py:3"),
            "line 3: cites fakefw==1.1, but the manifest pins this shim to fakefw==1.0",
            id="framework-version-differs-from-the-pin",
        ),
    ],
)
def test_shim_citation_violation_fails_naming_file_and_line(
    tmp_path: Path, fakefw: list[str], replace: tuple[bytes, bytes], expected: str
) -> None:
    text = SHIM_TEXT.replace(*replace)
    assert text != SHIM_TEXT
    wheel, evidence = audit(tmp_path, fakefw, {SHIM_PATH: text})
    assert evidence.verdict == "fail"
    assert evidence.figures["failures"][0].startswith(f"{wheel.name}: {SHIM_PATH}: {expected}")


def test_a_changed_cited_line_fails_naming_file_and_line(tmp_path: Path) -> None:
    """The framework's wheel (not the shim) changed the line the shim cites."""
    index = tmp_path / "index"
    changed = {**FAKEFW_FILES, "fakefw/caller.py": b"def run(c, x):\n    return c.hook(x, 1)\n"}
    build_files_wheel(index, changed)
    wheel, evidence = audit(tmp_path, ["--no-index", "--find-links", str(index)],
                            {SHIM_PATH: SHIM_TEXT})  # fmt: skip
    assert evidence.verdict == "fail"
    (failure,) = evidence.figures["failures"]
    assert failure.startswith(f"{wheel.name}: {SHIM_PATH}: line 6: cites fakefw/caller.py:2")
    assert "'return c.hook(x, 1)'" in failure
    assert "(changed line)" in failure


def test_a_stray_py_beside_a_cited_shim_fails(tmp_path: Path, fakefw: list[str]) -> None:
    wheel, evidence = audit(
        tmp_path, fakefw, {SHIM_PATH: SHIM_TEXT, "activekv/helpers.py": b"X = 1\n"}
    )
    assert evidence.verdict == "fail"
    assert evidence.figures["failures"] == [
        f"{wheel.name}: activekv/helpers.py: undeclared Python file "
        "(only the manifest's shims may ship)"
    ]


def test_bytecode_of_a_cited_shim_fails(tmp_path: Path, fakefw: list[str]) -> None:
    pyc = "activekv/__pycache__/connector.cpython-312.pyc"
    wheel, evidence = audit(tmp_path, fakefw, {SHIM_PATH: SHIM_TEXT, pyc: b"\x00bytecode"})
    assert evidence.verdict == "fail"
    assert evidence.figures["failures"] == [
        f"{wheel.name}: {pyc}: compiled Python bytecode may never ship"
    ]


def test_declared_shim_fails_when_shims_are_not_an_allowed_kind(
    tmp_path: Path, fakefw: list[str]
) -> None:
    _, evidence = audit(tmp_path, fakefw, {SHIM_PATH: SHIM_TEXT}, allow_shim=False)
    assert evidence.verdict == "fail"
    assert f"{SHIM_PATH}: kind 'shim' is not in payload.allowed_kinds" in evidence.reason


def test_a_shim_needs_a_framework_cache_to_be_judged(tmp_path: Path) -> None:
    digest = hashlib.sha256(SHIM_TEXT).hexdigest()
    manifest = shim_manifest(tmp_path, sha256=digest, framework="fakefw", version="1.0")
    wheel = make_wheel(tmp_path / "dist", {SHIM_PATH: SHIM_TEXT})
    with pytest.raises(GateError, match="expected a framework cache directory"):
        run_payload_gate(manifest, wheel_set(wheel), tmp_path / "out")


def test_evidence_file_names_every_wheel_digest_and_the_verdict(
    manifest: Manifest, tmp_path: Path
) -> None:
    good = make_wheel(tmp_path / "good", tag="cp311-cp311-manylinux_2_28_x86_64")
    bad = make_wheel(
        tmp_path / "bad", {"activekv/stray.py": b""}, tag="cp312-abi3-manylinux_2_28_x86_64"
    )
    out = tmp_path / "out"
    evidence = run_payload_gate(manifest, wheel_set(good, bad), out)
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
    run_payload_gate(manifest, wheel_set(good), out)
    record = json.loads(path.read_text())
    assert record["verdict"] == "pass"
    assert record["artefacts"] == {good.name: sha256_file(good)}


@pytest.mark.parametrize("member", ["reference/engine.py", "activekv/reference/engine.py"])
def test_the_python_reference_in_a_wheel_fails(
    manifest: Manifest, tmp_path: Path, member: str
) -> None:
    """The oracle lives in reference/ of the checkout and never ships: the real file, planted
    in a wheel at the top level or inside the package, is refused by name."""
    source = (REFERENCE_DIR / "engine.py").read_bytes()
    wheel = make_wheel(tmp_path, {member: source})
    evidence = run_payload_gate(manifest, wheel_set(wheel), tmp_path / "out")
    assert evidence.verdict == "fail"
    assert evidence.figures["failures"] == [
        f"{wheel.name}: {member}: undeclared Python file (only the manifest's shims may ship)"
    ]
