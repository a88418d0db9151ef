"""The licences a wheel owes (release/gates/licenses.py, through the payload gate): the project's
LICENSE and the notice of every library its modules link statically, under
`<dist-info>/licenses/`, named by METADATA's License-File lines (PEP 639), with the checkout's
text; and the checkout's texts are the pinned packages' own files.

Small wheels with real ELF modules (a `cc -shared` object whose `.activekv_sbom` facts are added
by objcopy) plant each omission; the real wheel must pass, and a copy of it without each notice
must fail naming the wheel and the file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures_wheels import wheel_set
from test_payload import CLEAN, DIST_INFO, LICENSE_MEMBER, METADATA_TEXT, make_wheel, without_sbom
from test_sbom_writer import GOOD_FACTS, _run, _section

from release.gates.licenses import NO_NOTICE, NOTICES, PROJECT_LICENSE
from release.gates.payload import list_wheel, run_payload_gate
from release.gates.sbom import _PROVENANCE
from release.manifest import Manifest, load_manifest
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.pins import pinned_version, pyproject

# apache.org's https://www.apache.org/licenses/LICENSE-2.0.txt, byte for byte.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
LICENSES = f"{DIST_INFO}/licenses"
ENGINE = "activekv/_engine.cpython-311-x86_64-linux-gnu.so"
LLVM = ("LICENSES/libcxx.txt", "LICENSES/libcxxabi.txt", "LICENSES/libunwind.txt")


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return without_sbom(load_manifest(DEFAULT_MANIFEST))


@pytest.fixture(scope="module")
def real_manifest() -> Manifest:
    """The real manifest (its SBOM required), less its shim, whose citations need vLLM's wheel
    (tests/test_payload.py judges them); licence files allowed."""
    real = load_manifest(DEFAULT_MANIFEST)
    kinds = without_sbom(real).payload.allowed_kinds
    payload = real.payload.model_copy(update={"shims": (), "allowed_kinds": kinds})
    return real.model_copy(update={"payload": payload})


def _wheel_problems(manifest: Manifest, wheel: Path) -> list[str]:
    """The payload gate's problems with the wheel's licence files and METADATA."""
    return [
        f"{e.wheel}: {e.path}: {e.problem}"
        for e in list_wheel(wheel, manifest)
        if e.problem and (f"{LICENSES}/" in e.path or e.path.endswith("/METADATA"))
    ]


def _committed(path: str) -> bytes:
    return (REPO_ROOT / path).read_bytes()


# ----------------------------------------------------------------------------- the texts


def test_the_licence_is_the_apache_2_0_text_verbatim():
    text = _committed(PROJECT_LICENSE)
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    assert pyproject()["project"]["license"] == "Apache-2.0"
    assert b"Copyright 2026 The ActiveKV authors" in _committed("NOTICE")


def _installed(distribution: str, group: str) -> Path:
    """The pinned distribution, installed in this environment at its pin."""
    assert importlib.metadata.version(distribution) == pinned_version(group, distribution)
    return Path(str(importlib.metadata.distribution(distribution).locate_file("")))


@pytest.mark.parametrize("path", LLVM)
def test_the_llvm_notices_are_the_pinned_zigs_own(path):
    """zig compiles and links its own libc++, libc++abi and libunwind; each has its licence."""
    library = Path(path).stem
    source = _installed("ziglang", "build") / "ziglang" / "lib" / library / "LICENSE.TXT"
    assert _committed(path) == source.read_bytes()
    assert b"Apache License v2.0 with LLVM Exceptions" in _committed(path)


def test_the_nanobind_notice_is_the_pinned_nanobinds_own():
    site = _installed("nanobind", "test")
    version = pinned_version("test", "nanobind")
    licence = site / f"nanobind-{version}.dist-info" / "licenses" / "LICENSE"
    assert _committed("LICENSES/nanobind.txt") == licence.read_bytes()


def test_the_robin_map_notice_is_the_one_in_nanobinds_copy():
    """nanobind ships robin-map's headers, whose opening comment is its MIT licence."""
    header = _installed("nanobind", "test") / "nanobind/ext/robin_map/include/tsl/robin_map.h"
    comment = re.match(r"/\*\*\n(.*?)\n \*/\n", header.read_text(), re.DOTALL)
    assert comment is not None
    lines = [re.sub(r"^ \*( |$)", "", line) for line in comment.group(1).split("\n")]
    assert _committed("LICENSES/robin-map.txt").decode() == "\n".join(lines) + "\n"


def _cuda_runtime_licence(tmp_path: Path) -> bytes:
    """The licence file of the pinned nvidia-cuda-runtime wheel: where the toolchain installed
    it (the pinned wheels, or a toolkit made of them), else the wheel fetched from the index."""
    version = pinned_version("cuda-compiler", "nvidia-cuda-runtime")
    info = f"nvidia_cuda_runtime-{version}.dist-info/licenses/License.txt"
    cache = Path(os.environ.get("ACTIVEKV_CACHE_DIR", REPO_ROOT / ".activekv" / "cache"))
    roots = [cache / "toolchain" / "cuda-wheels"]
    for cuda in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        roots += [Path(cuda).resolve() / "dist-info", Path(cuda).resolve()]
    for root in roots:
        if (root / info).is_file():
            return (root / info).read_bytes()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "-d", str(tmp_path), f"nvidia-cuda-runtime=={version}"]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    (wheel,) = tmp_path.glob("nvidia_cuda_runtime-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(info)


def test_the_cuda_runtime_notice_is_the_pinned_runtimes_eula(tmp_path):
    """libcudart_static.a is linked in; the pinned runtime wheel's licence is NVIDIA's CUDA EULA,
    whose Attachment A lists it as distributable."""
    committed = _committed("LICENSES/cudart.txt")
    assert committed == _cuda_runtime_licence(tmp_path)
    assert b"Attachment A" in committed and b"libcudart_static.a" in committed


def test_every_library_a_module_may_link_has_its_notice_or_needs_none():
    """A library the SBOM writer can name (release/gates/sbom.py _PROVENANCE) without a decision
    here would ship linked in with no notice."""
    assert set(NOTICES) | NO_NOTICE == set(_PROVENANCE)
    assert not set(NOTICES) & NO_NOTICE


def test_notice_lists_each_committed_licence_and_the_wheels_take_them_all():
    committed = sorted(f"LICENSES/{p.name}" for p in (REPO_ROOT / "LICENSES").iterdir())
    assert committed == sorted(set(NOTICES.values()))
    notice = _committed("NOTICE").decode()
    assert all(path in notice for path in committed)
    # pyproject.toml's project.license-files (PEP 639): what scikit-build-core copies into
    # <dist-info>/licenses/ and names in METADATA's License-File lines.
    patterns = pyproject()["project"]["license-files"]
    taken = {str(p.relative_to(REPO_ROOT)) for g in patterns for p in REPO_ROOT.glob(g)}
    assert {PROJECT_LICENSE, "NOTICE", *committed} <= taken


# ----------------------------------------------------------------------------- small wheels


def _metadata(*lines: str) -> bytes:
    return (
        b"Metadata-Version: 2.4\nName: activekv\nVersion: 0.1.0\n"
        + "".join(f"{line}\n" for line in lines).encode()
    )


def _licensed(paths: tuple[str, ...] | list[str]) -> dict[str, bytes]:
    """The members that carry `paths` (the checkout's texts), and METADATA naming them."""
    members = {f"{LICENSES}/{path}": _committed(path) for path in paths}
    names = [f"License-File: {path}" for path in paths]
    return {**members, f"{DIST_INFO}/METADATA": _metadata("License-Expression: Apache-2.0", *names)}


def _failures(manifest: Manifest, wheel: Path, tmp_path: Path) -> list[str]:
    evidence = run_payload_gate(manifest, wheel_set(wheel), tmp_path / "out")
    return evidence.figures["failures"]


def _wheel(tmp_path: Path, extra: dict[str, bytes], drop: tuple[str, ...] = ()) -> Path:
    """make_wheel's clean wheel with `extra`, less the members `drop`."""
    wheel = make_wheel(tmp_path / "made", extra)
    if not drop:
        return wheel
    copy = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(copy, "w") as target:
        for info in source.infolist():
            if info.filename not in drop:
                target.writestr(info, source.read(info))
    return copy


def test_the_clean_wheel_carries_its_licence_named_by_metadata(manifest, tmp_path):
    assert CLEAN[f"{DIST_INFO}/METADATA"] == METADATA_TEXT
    assert _failures(manifest, _wheel(tmp_path, {}), tmp_path) == []


@pytest.mark.parametrize(
    ("extra", "drop", "member", "why"),
    [
        pytest.param(
            {f"{DIST_INFO}/METADATA": _metadata("License-Expression: Apache-2.0")},
            (LICENSE_MEMBER,),
            LICENSE_MEMBER,
            "missing: the project's licence; expected the checkout's LICENSE here (NOTICE)",
            id="no-licence",
        ),
        pytest.param(
            {LICENSE_MEMBER: b"All rights reserved.\n"},
            (),
            LICENSE_MEMBER,
            "expected the text of the checkout's LICENSE (the project's licence), sha256 "
            f"{APACHE_2_0_SHA256}; got sha256 ",
            id="licence-of-other-text",
        ),
        pytest.param(
            {LICENSE_MEMBER: b""},
            (),
            LICENSE_MEMBER,
            "expected the text of the checkout's LICENSE",
            id="licence-empty",
        ),
        pytest.param(
            {
                LICENSE_MEMBER: _committed("LICENSE"),
                f"{DIST_INFO}/METADATA": _metadata(
                    "License-Expression: Apache-2.0",
                    "License-File: LICENSE",
                    "License-File: COPYING",
                ),
            },
            (),
            f"{LICENSES}/COPYING",
            "missing: METADATA names it in a License-File line; expected the file (PEP 639)",
            id="license-file-line-without-its-file",
        ),
        pytest.param(
            {f"{LICENSES}/LICENSES/nanobind.txt": _committed("LICENSES/nanobind.txt")},
            (),
            f"{LICENSES}/LICENSES/nanobind.txt",
            "METADATA names it in no License-File line; expected every file under licenses/",
            id="licence-file-metadata-does-not-name",
        ),
        pytest.param(
            {f"{DIST_INFO}/METADATA": _metadata("License-File: LICENSE")},
            (),
            f"{DIST_INFO}/METADATA",
            "License-Expression: expected the SPDX expression of the package's licence (PEP 639)",
            id="no-license-expression",
        ),
        pytest.param(
            {},
            (f"{DIST_INFO}/METADATA",),
            f"{DIST_INFO}/METADATA",
            "missing: expected METADATA, which names the licence",
            id="no-metadata",
        ),
    ],
)
def test_a_planted_licence_problem_fails_naming_the_wheel_and_the_file(
    manifest, tmp_path, extra, drop, member, why
):
    wheel = _wheel(tmp_path, extra, drop)
    failures = _failures(manifest, wheel, tmp_path)
    assert [f for f in failures if f.startswith(f"{wheel.name}: {member}: {why}")], failures


@pytest.fixture
def elf_module(tmp_path: Path) -> Callable[..., bytes]:
    """The bytes of a shared object with these `.activekv_sbom` facts; `needs` a shared library
    by this soname (DT_NEEDED), as a module that loads libc++ at run time does."""
    if shutil.which("cc") is None or shutil.which("objcopy") is None:
        pytest.skip("needs a C compiler (cc) and objcopy to make small ELF files")

    def make(facts: dict[str, str] = GOOD_FACTS, needs: str = "") -> bytes:
        (tmp_path / "m.c").write_text("int activekv_probe(void) { return 1; }\n")
        base, link = tmp_path / "base.so", []
        if needs:
            _run("cc", "-shared", "-fPIC", "-o", tmp_path / needs, f"-Wl,-soname,{needs}",
                 tmp_path / "m.c")  # fmt: skip
            link = ["-Wl,--no-as-needed", tmp_path / needs]
        _run("cc", "-shared", "-fPIC", "-o", base, tmp_path / "m.c", *link)
        (tmp_path / "facts").write_bytes(_section(facts))
        _run("objcopy", "--add-section", f".activekv_sbom={tmp_path / 'facts'}", base,
             tmp_path / "module.so")  # fmt: skip
        return (tmp_path / "module.so").read_bytes()

    return make


ALL_NOTICES = (PROJECT_LICENSE, *sorted(set(NOTICES.values())))


def test_a_module_with_every_notice_beside_it_passes(manifest, tmp_path, elf_module):
    wheel = _wheel(tmp_path, {ENGINE: elf_module(), **_licensed(ALL_NOTICES)})
    assert _failures(manifest, wheel, tmp_path) == []


@pytest.mark.parametrize("notice", sorted(set(NOTICES.values())))
def test_a_library_linked_statically_without_its_notice_fails(
    manifest, tmp_path, elf_module, notice
):
    """The module's own facts say what it carries: each notice left out fails, naming it, the
    library and the module."""
    paths = [path for path in ALL_NOTICES if path != notice]
    wheel = _wheel(tmp_path, {ENGINE: elf_module(), **_licensed(paths)})
    failures = _failures(manifest, wheel, tmp_path)
    library = next(name for name, path in NOTICES.items() if path == notice)
    expected = (
        f"{wheel.name}: {LICENSES}/{notice}: missing: the notice of {library}, which {ENGINE} "
        f"links statically; expected the checkout's {notice} here (NOTICE)"
    )
    assert failures == [expected]


def test_a_library_the_module_loads_needs_no_notice_a_static_one_does(
    manifest, tmp_path, elf_module
):
    """libc++ loaded at run time (DT_NEEDED libc++.so.1, which loads libc++abi and libunwind) is
    not shipped, so its notices are not owed; nanobind, compiled in, still is."""
    module = elf_module(needs="libc++.so.1")
    paths = [p for p in ALL_NOTICES if p not in LLVM]
    assert (
        _failures(manifest, _wheel(tmp_path, {ENGINE: module, **_licensed(paths)}), tmp_path) == []
    )
    without = [p for p in paths if p != "LICENSES/nanobind.txt"]
    wheel = _wheel(tmp_path / "b", {ENGINE: module, **_licensed(without)})
    failures = _failures(manifest, wheel, tmp_path)
    assert len(failures) == 1 and "missing: the notice of nanobind, which" in failures[0]


def test_a_library_the_sbom_says_is_linked_statically_needs_its_notice(tmp_path):
    """A module whose facts cannot be read still has its SBOM: a component it lists as static
    needs its notice too (the SBOM gate judges the rest of that document)."""
    real = load_manifest(DEFAULT_MANIFEST)
    sbom = without_sbom(real).payload.model_copy(update={"sbom": real.payload.sbom})
    manifest = real.model_copy(update={"payload": sbom})
    member = f"{DIST_INFO}/sboms/activekv.cdx.json"
    document = {"components": [{"name": "cudart", "properties": [
        {"name": "activekv:linkage", "value": "static"}]}]}  # fmt: skip
    wheel = _wheel(tmp_path, {member: json.dumps(document).encode()})
    problems = {e.path: e.problem for e in list_wheel(wheel, manifest) if e.problem}
    assert problems[f"{LICENSES}/LICENSES/cudart.txt"] == (
        f"missing: the notice of cudart, which the SBOM ({member}) links statically; expected "
        "the checkout's LICENSES/cudart.txt here (NOTICE)"
    )


# ----------------------------------------------------------------------------- the real wheel


def test_the_real_wheel_carries_its_licence_and_every_notice(built_wheel, real_manifest):
    with zipfile.ZipFile(built_wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"{DIST_INFO}/METADATA").decode()
        for path in (*ALL_NOTICES, "NOTICE"):
            assert archive.read(f"{LICENSES}/{path}") == _committed(path), path
    assert "License-Expression: Apache-2.0\n" in metadata
    listed = re.findall(r"^License-File: (.*)$", metadata, re.MULTILINE)
    assert sorted(listed) == sorted((*ALL_NOTICES, "NOTICE"))
    files = {n for n in names if n.startswith(f"{LICENSES}/") and not n.endswith("/")}
    assert files == {f"{LICENSES}/{p}" for p in listed}
    assert _wheel_problems(real_manifest, built_wheel) == []


@pytest.mark.parametrize("path", ALL_NOTICES)
def test_the_real_wheel_without_a_notice_fails_naming_it(
    built_wheel, real_manifest, tmp_path, path
):
    member = f"{LICENSES}/{path}"
    copy = tmp_path / built_wheel.name
    with zipfile.ZipFile(built_wheel) as source, zipfile.ZipFile(copy, "w") as target:
        for info in source.infolist():
            if info.filename != member:
                target.writestr(info, source.read(info))
    failures = _wheel_problems(real_manifest, copy)
    why = "the project's licence" if path == PROJECT_LICENSE else "the notice of "
    assert [f for f in failures if f.startswith(f"{copy.name}: {member}: missing: {why}")], failures
