"""The SBOM in every wheel (PEP 770): cmake/write_sbom.py writes it at build time, the payload gate
(release/gates/sbom.py) judges it against the wheel's own modules.

The real wheel's SBOM must pass; each negative control plants one lie or omission in a copy of
that wheel and must fail the payload gate naming it.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile
from test_sbom_writer import writer_arguments

from release.gates.payload import list_wheel
from release.gates.sbom_facts import (
    FactError,
    expected_components,
    expected_linkage,
    module_facts,
    module_needed,
)
from release.manifest import Manifest, load_manifest
from release.util.paths import DEFAULT_MANIFEST

REPO = Path(__file__).resolve().parent.parent
MEMBER = "activekv-0.1.0.dist-info/sboms/activekv.cdx.json"
Document = dict[str, Any]


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    """The real manifest, less its shim: the shim's citations are judged with vLLM's own wheel
    (tests/test_payload.py, tests/test_citations.py); here only the SBOM's problems count."""
    real = load_manifest(DEFAULT_MANIFEST)
    return real.model_copy(update={"payload": real.payload.model_copy(update={"shims": ()})})


def _sbom(wheel: Path) -> Document:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read(MEMBER))


Change = Callable[[Document], Document | bytes | None]


def _rewritten(wheel: Path, folder: Path, change: Change) -> Path:
    """A copy of `wheel` whose SBOM is `change`d (bytes: its new text; None: removed), stored
    uncompressed (quicker to write and read)."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(copy, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == MEMBER:
                changed = change(json.loads(data))
                if changed is None:
                    continue
                data = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
            info.compress_type = zipfile.ZIP_STORED
            target.writestr(info, data)
    return copy


def _problems(wheel: Path, manifest: Manifest) -> list[str]:
    """What the payload gate finds wrong with the wheel's SBOM."""
    return [
        f"{e.path}: {e.problem}"
        for e in list_wheel(wheel, manifest)
        if e.path == MEMBER and e.problem
    ]


def _toolchain_record(wheel: Path) -> dict[str, str]:
    """The toolchain record of the build that made `wheel` (its build.json)."""
    record = wheel.parent.parent / "build.json"
    if not record.is_file():  # ACTIVEKV_TEST_WHEEL named a wheel built elsewhere
        pytest.skip(f"no build record beside {wheel}")
    return json.loads(record.read_text())["toolchain"]


def _component(document: Document, name: str) -> Document:
    return next(c for c in document["components"] if c["name"] == name)


def test_the_real_wheel_carries_an_sbom_that_tells_the_truth(built_wheel, manifest):
    assert _problems(built_wheel, manifest) == []
    document = _sbom(built_wheel)
    assert (document["bomFormat"], document["specVersion"]) == ("CycloneDX", "1.6")
    names = {c["name"]: c for c in document["components"]}
    assert {"activekv._engine", "activekv._fabric", "activekv._vllm"} <= set(names)
    for part in ("libc++", "libc++abi", "libunwind", "cudart", "nanobind", "robin-map"):
        assert part in names and names[part]["version"], part
        assert names[part]["licenses"], part
    assert names["nanobind"]["purl"] == f"pkg:pypi/nanobind@{names['nanobind']['version']}"
    assert names["libc++"]["cpe"].startswith("cpe:2.3:a:llvm:llvm:")
    engine = names["activekv._engine"]
    properties = {p["name"]: p["value"] for p in engine["properties"]}
    assert properties["activekv:cuda_architectures"] == "80-real,90-real,100-real,100-virtual"
    # the build tools, with the digests the provenance records
    tools = {t["name"]: t for t in document["metadata"]["tools"]["components"]}
    for tool in ("zig", "nvcc", "cuda-host-compiler", "cmake", "nanobind", "scikit-build-core"):
        assert tools[tool]["hashes"][0]["alg"] == "SHA-256", tool
    # the package's licence, and each module's digest as the wheel holds it (after auditwheel)
    assert document["metadata"]["component"]["licenses"] == [{"expression": "Apache-2.0"}]
    for module in ("_engine", "_fabric", "_vllm"):
        digest = _member_sha256(built_wheel, f"activekv/{module}.", ".so")
        assert names[f"activekv.{module}"]["hashes"] == [{"alg": "SHA-256", "content": digest}]
    record = _toolchain_record(built_wheel)
    assert tools["zig"]["hashes"][0]["content"] == record["zig_sha256"]
    assert tools["nanobind"]["hashes"][0]["content"] == record["nanobind_sha256"]
    # exact versions, never a banner: nvcc's full version, the host compiler's number
    assert tools["cmake"]["version"] == record["cmake"]
    assert tools["nvcc"]["version"] == record["nvcc_version"]
    assert tools["cuda-host-compiler"]["version"] == record["cuda_host_compiler"].split()[-1]


def _member_sha256(wheel: Path, prefix: str, suffix: str = "") -> str:
    """The SHA-256 of the one member of `wheel` whose name starts with `prefix` (and ends with
    `suffix`)."""
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.startswith(prefix) and n.endswith(suffix)]
        return hashlib.sha256(archive.read(path)).hexdigest()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda wheel: _edit(
                lambda d: d["metadata"]["component"].update(purl="pkg:pypi/ActiveKV@0.1.0")
            ),
            id="package-purl-spelled-otherwise",
        ),
        pytest.param(
            lambda wheel: _update(
                ENGINE,
                hashes=[
                    {
                        "alg": "SHA-256",
                        "content": _member_sha256(wheel, "activekv/_engine.cpython").upper(),
                    }
                ],
            ),
            id="module-hash-of-the-module",
        ),
    ],
)
def test_what_tells_the_truth_another_way_passes(built_wheel, manifest, tmp_path, change):
    """Negative controls need positive ones: the same purl spelled otherwise, and a module's
    true digest in capitals (the same digest), pass."""
    wheel = _rewritten(built_wheel, tmp_path, change(built_wheel))
    assert _problems(wheel, manifest) == []


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param((), id="no-host-compiler"),
        pytest.param(("--cuda-host-compiler", sys.executable), id="host-compiler"),
    ],
)
def test_an_sbom_written_without_a_record_passes_and_its_tools_are_judged(
    built_wheel, manifest, tmp_path, extra
):
    """cibuildwheel in CI passes no toolchain record: the writer names the tools CMake ran,
    nanobind and scikit-build-core unhashed, the host compiler unversioned. The gate takes that
    set, and in it refuses what the writer does not give."""
    done = _write_sbom(tmp_path, built_wheel, *extra)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "sbom.json").read_bytes()
    wheel = _rewritten(built_wheel, tmp_path / "as-written", lambda d: written)
    assert _problems(wheel, manifest) == []
    lie = _edit(lambda d: _tool(d, "nanobind").update(hashes=MADE_UP_SHA256))
    problems = " ".join(
        _problems(_rewritten(built_wheel, tmp_path / "lie", _then(written, lie)), manifest)
    )
    assert "(nanobind): hashes: expected none (cmake/write_sbom.py has no file" in problems
    zeroed = _edit(lambda d: _tool(d, "cxx-compiler")["hashes"][0].update(content="0" * 64))
    problems = " ".join(
        _problems(_rewritten(built_wheel, tmp_path / "zero", _then(written, zeroed)), manifest)
    )
    assert "(cxx-compiler): hashes: expected one SHA-256 of 64 lowercase hex digits" in problems


def _then(text: bytes, change: Change) -> Change:
    """A change that replaces the SBOM with `text`, then applies `change` to it."""
    return lambda document: change(json.loads(text))


def test_the_versions_come_from_the_modules_themselves(built_wheel):
    with zipfile.ZipFile(built_wheel) as archive:
        (engine,) = [
            n for n in archive.namelist() if n.startswith("activekv/_engine.") and n.endswith(".so")
        ]
        facts = module_facts(archive.read(engine))
    expected = expected_components(facts)
    document = _sbom(built_wheel)
    for name, version in expected.items():
        assert _component(document, name)["version"] == version
    import nanobind  # the build's pinned nanobind, whose headers the module compiled

    assert expected["nanobind"] == nanobind.__version__


def _set_version(name: str, version: str) -> Callable[[Document], Document]:
    return _update(name, version=version)


def _update(name: str, **fields: Any) -> Callable[[Document], Document]:
    """A change that sets `fields` on the component `name`."""

    def change(document: Document) -> Document:
        _component(document, name).update(fields)
        return document

    return change


def _drop_module(document: Document) -> Document:
    """activekv._fabric left out, and every ref to it (no dangling ref gives it away)."""
    document["components"] = [c for c in document["components"] if c["name"] != "activekv._fabric"]
    document["dependencies"] = [
        {**d, "dependsOn": [r for r in d.get("dependsOn", []) if r != "activekv._fabric"]}
        for d in document["dependencies"]
        if d["ref"] != "activekv._fabric"
    ]
    return document


def _add_component(document: Document) -> Document:
    document["components"].append(
        {"type": "library", "name": "zlib", "version": "1.3.1", "bom-ref": "zlib@1.3.1"}
    )
    return document


def _invalid(document: Document) -> Document:
    document["components"][0]["type"] = "blob"
    return document


def _architectures(document: Document) -> Document:
    for prop in _component(document, "activekv._engine")["properties"]:
        if prop["name"] == "activekv:cuda_architectures":
            prop["value"] = "80-real"
    return document


def _other_package(document: Document) -> Document:
    document["metadata"]["component"]["version"] = "9.9.9"
    return document


ENGINE = "activekv._engine"
ZLIB = {"type": "library", "name": "zlib", "version": "1.3.1", "bom-ref": "zlib@1.3.1"}


def _edit(edit: Callable[[Document], object]) -> Change:
    """A change that applies `edit` to the document in place."""

    def change(document: Document) -> Document:
        edit(document)
        return document

    return change


def _text(edit: Callable[[str], str | bytes]) -> Change:
    """A change of the document's JSON text."""

    def change(document: Document) -> bytes:
        text = edit(json.dumps(document))
        return text if isinstance(text, bytes) else text.encode()

    return change


def _depends(document: Document, ref: str) -> list[str]:
    return next(d for d in document["dependencies"] if d["ref"] == ref)["dependsOn"]


def _first(document: Document, component: Document) -> None:
    """`component` listed first, so a reader keeping the last entry per key sees the real one."""
    document["components"].insert(0, component)


def _tool(document: Document, name: str) -> Document:
    return next(t for t in document["metadata"]["tools"]["components"] if t["name"] == name)


def _every_tool_hash(content: str) -> Change:
    """Every tool's digest set to `content` (a zeroed one: 64 zeros)."""

    def edit(document: Document) -> None:
        for tool in document["metadata"]["tools"]["components"]:
            for digest in tool.get("hashes", []):
                digest["content"] = content

    return _edit(edit)


def _no_licences(document: Document) -> Document:
    for component in document["components"]:
        component.pop("licenses", None)
    return document


OPENSSL_CPE = "cpe:2.3:a:openssl:openssl:0.1.0:*:*:*:*:*:*:*"
MADE_UP_SHA256 = [{"alg": "SHA-256", "content": "ab" * 32}]
GCC_BANNER = "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"
PACKAGE = "pkg:pypi/activekv@0.1.0"


def _nested(depth: int) -> list[Document]:
    """Components nested `depth` deep: JSON that parses, but deeper than the validator recurses."""
    nested: list[Document] = []
    for level in range(depth):
        nested = [{**ZLIB, "bom-ref": f"zlib{level}", "components": nested}]
    return nested


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param(lambda d: None, "missing: every wheel carries its SBOM", id="no-sbom"),
        pytest.param(
            _set_version("libc++", "17.0.6"),
            "libc++: the SBOM says 17.0.6;",
            id="lying-libcxx-version",
        ),
        pytest.param(
            _set_version("cudart", "12.4"), "cudart: the SBOM says 12.4;", id="lying-cuda-version"
        ),
        pytest.param(
            _set_version("nanobind", "2.0.0"),
            "nanobind: the SBOM says 2.0.0;",
            id="lying-nanobind-version",
        ),
        pytest.param(_drop_module, "expected a component activekv._fabric", id="module-left-out"),
        pytest.param(_add_component, "zlib 1.3.1: listed, but no module", id="made-up-component"),
        pytest.param(
            _invalid, "does not validate against the CycloneDX 1.6 schema", id="schema-invalid"
        ),
        pytest.param(_architectures, "activekv:cuda_architectures: expected", id="architectures"),
        pytest.param(
            _update("cudart", properties=[{"name": "activekv:linkage", "value": "dynamic"}]),
            "activekv:linkage: expected static (activekv/_engine.",
            id="linkage-that-lies",
        ),
        pytest.param(
            _update("nanobind", properties=[]),
            "(nanobind@3.1.0:static): activekv:linkage: expected static",
            id="linkage-left-out",
        ),
        pytest.param(
            _other_package, "metadata.component: expected activekv 0.1.0", id="another-package"
        ),
        # one reading only: no ref, file, key, property or dependency entry given twice
        pytest.param(
            _edit(lambda d: _first(d, {**ZLIB, "bom-ref": "nanobind@3.1.0:static"})),
            "bom-ref 'nanobind@3.1.0:static': expected one component with it; got 2",
            id="made-up-component-with-a-real-ref",
        ),
        pytest.param(
            _edit(lambda d: _first(d, {**ZLIB, "properties": _component(d, ENGINE)["properties"]})),
            "activekv:file 'activekv/_engine.",
            id="made-up-component-with-a-real-file",
        ),
        pytest.param(
            _text(lambda t: t.replace('"name": "nanobind"', '"name": "zlib", "name": "nanobind"')),
            "ambiguous JSON: expected each key once in an object; got 'name' twice",
            id="repeated-key",
        ),
        pytest.param(
            _edit(
                lambda d: _component(d, ENGINE)["properties"].insert(
                    0, {"name": "activekv:cuda_architectures", "value": "80-real"}
                )
            ),
            "properties: expected 'activekv:cuda_architectures' once; got it 2 times",
            id="repeated-property",
        ),
        pytest.param(
            _edit(lambda d: d["dependencies"].insert(0, {"ref": ENGINE})),
            "dependencies: expected one entry for 'activekv._engine'; got 2",
            id="repeated-dependency-entry",
        ),
        pytest.param(
            _text(
                lambda t: (
                    t.replace('"Tessil"', '"Tess\\u00efl"').encode().replace(b"\\u00ef", b"\xef")
                )
            ),
            "not UTF-8: expected UTF-8 JSON; got invalid continuation byte",
            id="invalid-utf-8",
        ),
        pytest.param(
            _text(lambda t: "[" * 100_000 + "]" * 100_000),
            "not JSON this gate can read: expected a document; got nesting too deep",
            id="nested-too-deep",
        ),
        pytest.param(
            _update(ENGINE, components=_nested(300)),
            "schema: expected a document the validator can read; got nesting too deep",
            id="nested-too-deep-to-validate",
        ),
        pytest.param(
            _edit(lambda d: d["components"].append(d["components"][-1])),
            "] has non-unique elements",  # the reason kept, however long the instance
            id="schema-reason-kept",
        ),
        # every component seen, every ref resolved
        pytest.param(
            _update(ENGINE, components=[ZLIB]),
            f"components[0] ({ENGINE}): expected no nested components",
            id="nested-component",
        ),
        pytest.param(
            _edit(lambda d: d["metadata"]["component"].update(components=[ZLIB])),
            "metadata.component: expected no nested components",
            id="nested-in-the-package",
        ),
        pytest.param(
            _edit(lambda d: _depends(d, ENGINE).append("zlib@1.3.1")),
            "dependencies: 'activekv._engine' dependsOn 'zlib@1.3.1': expected a component's",
            id="dangling-depends-on",
        ),
        pytest.param(
            _edit(lambda d: d["dependencies"].append({"ref": "zlib@1.3.1"})),
            "dependencies: ref 'zlib@1.3.1': expected a component's bom-ref; got none",
            id="dangling-dependency-ref",
        ),
        # what each module depends on is what its facts say, both ways
        pytest.param(
            _edit(lambda d: _depends(d, ENGINE).append("activekv._vllm")),
            f"{ENGINE}: dependsOn: expected only ['cudart', 'libc++', 'libc++abi', 'libunwind', "
            "'nanobind', 'robin-map'] (its facts); got activekv._vllm 0.1.0, which",
            id="module-lists-what-it-does-not-link",
        ),
        pytest.param(
            _edit(
                lambda d: (
                    d["components"].append({**_component(d, "libc++"), "bom-ref": "libc++ again"}),
                    _depends(d, ENGINE).append("libc++ again"),
                )
            ),
            f"{ENGINE}: dependsOn: expected libc++ once; got it 2 times",
            id="module-lists-a-part-twice",
        ),
        pytest.param(
            _edit(lambda d: _depends(d, "pkg:pypi/activekv@0.1.0").remove("activekv._fabric")),
            "metadata.component: dependsOn: expected its modules ['activekv._engine', "
            "'activekv._fabric', 'activekv._vllm']; got ['activekv._engine', 'activekv._vllm']",
            id="package-leaves-out-a-module",
        ),
        # identifiers and versions agree
        pytest.param(
            _update("nanobind", purl="pkg:pypi/nanobind@2.0.0"),
            "(nanobind): purl: expected the version 3.1.0; got 'pkg:pypi/nanobind@2.0.0'",
            id="purl-of-another-version",
        ),
        pytest.param(
            _update("libc++", purl="pkg:github/llvm/llvm-project@llvmorg-17.0.6#libcxx"),
            "(libc++): purl: expected the version llvmorg-22.",
            id="release-tag-of-another-version",
        ),
        pytest.param(
            _update("cudart", cpe="cpe:2.3:a:nvidia:cuda_toolkit:12.4:*:*:*:*:*:*:*"),
            "(cudart): cpe: expected the version 13.",
            id="cpe-of-another-version",
        ),
        pytest.param(
            _update("nanobind", purl="pkg:pypi/evil@3.1.0"),
            "(nanobind): purl: expected pkg:pypi/nanobind; got 'pkg:pypi/evil@3.1.0'",
            id="purl-of-another-package",
        ),
        pytest.param(
            _edit(lambda d: _component(d, "libc++").pop("purl")),
            "(libc++): purl: expected a purl for libc++; got None",
            id="purl-left-out",
        ),
        pytest.param(
            _update("cudart", cpe="cpe:2.3:a:evil:cuda_toolkit:13.0:*:*:*:*:*:*:*"),
            "(cudart): cpe: expected vendor:product nvidia:cuda_toolkit; got",
            id="cpe-of-another-product",
        ),
        pytest.param(
            _update("robin-map", cpe="cpe:2.3:a:x:y:1.4.0:*:*:*:*:*:*:*"),
            "(robin-map): cpe: expected no CPE for robin-map; got",
            id="cpe-where-none-is",
        ),
        pytest.param(
            _update(ENGINE, version="9.9.9"),
            f"{ENGINE}: version: expected 0.1.0 (the wheel's); got 9.9.9",
            id="module-of-another-version",
        ),
        # JSON only: the constants Python's json reads and JSON does not have
        *[
            pytest.param(
                _edit(lambda d, n=number: d.update(vulnerabilities=[{"ratings": [{"score": n}]}])),
                f"not JSON: expected JSON numbers; got {spelled}, which JSON does not allow",
                id=f"{spelled}-is-not-json",
            )
            for number, spelled in (
                (float("nan"), "NaN"),
                (float("inf"), "Infinity"),
                (float("-inf"), "-Infinity"),
            )
        ],
        # the package and its modules are who the wheel is, by every identifier
        pytest.param(
            _edit(lambda d: d["metadata"]["component"].update(purl="pkg:pypi/numpy@0.1.0")),
            f"metadata.component: purl: expected {PACKAGE} (the wheel's); got "
            "'pkg:pypi/numpy@0.1.0'",
            id="package-purl-of-another-package",
        ),
        pytest.param(
            _edit(lambda d: d["metadata"]["component"].pop("purl")),
            f"metadata.component: purl: expected {PACKAGE} (the wheel's); got None",
            id="package-purl-left-out",
        ),
        pytest.param(
            _edit(lambda d: d["metadata"]["component"].update(cpe=OPENSSL_CPE)),
            f"metadata.component: cpe: expected none (cmake/write_sbom.py gives the package "
            f"none); got '{OPENSSL_CPE}'",
            id="package-cpe-of-another-product",
        ),
        pytest.param(
            _update(ENGINE, purl="pkg:pypi/numpy@0.1.0"),
            f"({ENGINE}): purl: expected none (cmake/write_sbom.py gives {ENGINE} none); got",
            id="module-purl",
        ),
        pytest.param(
            _update(ENGINE, cpe=OPENSSL_CPE),
            f"({ENGINE}): cpe: expected none (cmake/write_sbom.py gives {ENGINE} none); got",
            id="module-cpe",
        ),
        pytest.param(
            _update(ENGINE, hashes=MADE_UP_SHA256),
            f"{ENGINE}: hashes: expected one SHA-256, that of activekv/_engine.",
            id="module-made-up-hash",
        ),
        pytest.param(
            _edit(lambda d: _component(d, ENGINE).pop("hashes")),
            f"{ENGINE}: hashes: expected one SHA-256, that of activekv/_engine.",
            id="module-hash-left-out",
        ),
        pytest.param(
            _edit(
                lambda d: _component(d, ENGINE).update(
                    hashes=_component(d, "activekv._fabric")["hashes"]
                )
            ),
            f"{ENGINE}: hashes: expected one SHA-256, that of activekv/_engine.",
            id="module-hash-of-another-module",
        ),
        pytest.param(
            _edit(
                lambda d: _component(d, ENGINE)["hashes"].append(
                    {"alg": "SHA-512", "content": "ab" * 64}
                )
            ),
            f"{ENGINE}: hashes: expected one SHA-256, that of activekv/_engine.",
            id="module-hash-and-another",
        ),
        # the package's licence: METADATA's License-Expression
        pytest.param(
            _edit(lambda d: d["metadata"]["component"].pop("licenses")),
            'metadata.component: licenses: expected [{"expression": "Apache-2.0"}] (METADATA\'s '
            "License-Expression); got null",
            id="package-licence-left-out",
        ),
        pytest.param(
            _edit(lambda d: d["metadata"]["component"].update(licenses=[{"expression": "MIT"}])),
            'metadata.component: licenses: expected [{"expression": "Apache-2.0"}]',
            id="package-licence-of-another",
        ),
        # each library's licence and supplier as the writer gives them, and no digest
        pytest.param(
            _no_licences,
            '(cudart): licenses: expected [{"license": {"name": "NVIDIA CUDA Toolkit End User '
            'License Agreement"}}] (cmake/write_sbom.py); got null',
            id="licences-left-out",
        ),
        pytest.param(
            _update("libc++", licenses=[{"expression": "MIT"}]),
            '(libc++): licenses: expected [{"expression": "Apache-2.0 WITH LLVM-exception"}] '
            '(cmake/write_sbom.py); got [{"expression": "MIT"}]',
            id="libcxx-as-mit",
        ),
        pytest.param(
            _update(
                "robin-map",
                licenses=[{"license": {"id": "MIT"}}, {"license": {"id": "GPL-3.0-only"}}],
            ),
            '(robin-map): licenses: expected [{"expression": "MIT"}] (cmake/write_sbom.py); got '
            '[{"license": {"id": "MIT"}}, {"license": {"id": "GPL-3.0-only"}}]',
            id="a-licence-added",
        ),
        pytest.param(
            _update("cudart", supplier={"name": "Evil Corp"}),
            '(cudart): supplier: expected {"name": "NVIDIA"} (cmake/write_sbom.py); got',
            id="another-supplier",
        ),
        pytest.param(
            _edit(lambda d: _component(d, "nanobind").pop("supplier")),
            '(nanobind): supplier: expected {"name": "Wenzel Jakob"} (cmake/write_sbom.py); got '
            "null",
            id="supplier-left-out",
        ),
        pytest.param(
            _update("robin-map", hashes=MADE_UP_SHA256),
            "(robin-map): hashes: expected none (cmake/write_sbom.py hashes no library)",
            id="library-made-up-hash",
        ),
        # the tools the writer names, each with its version and digest
        pytest.param(
            _every_tool_hash("0" * 64),
            "(zig): hashes: expected one SHA-256 of 64 lowercase hex digits, not all zero",
            id="tool-hashes-zeroed",
        ),
        pytest.param(
            _every_tool_hash("0" * 40),  # a length the schema allows (SHA-1's)
            "(cmake): hashes: expected one SHA-256 of 64 lowercase hex digits",
            id="tool-hash-of-another-length",
        ),
        pytest.param(
            _edit(lambda d: _tool(d, "nvcc").pop("hashes")),
            "(nvcc): hashes: expected one SHA-256 of 64 lowercase hex digits, not all zero "
            "(cmake/write_sbom.py); got null",
            id="tool-hash-left-out",
        ),
        pytest.param(
            _edit(lambda d: _tool(d, "zig")["hashes"].append(MADE_UP_SHA256[0])),
            "(zig): hashes: expected one SHA-256",
            id="tool-hash-added",
        ),
        pytest.param(
            _edit(lambda d: _tool(d, "cuda-host-compiler").pop("version")),
            "(cuda-host-compiler): version: expected the tool's exact version, a number "
            "major.minor.patch (cmake/write_sbom.py), not a banner; got None",
            id="tool-version-left-out",
        ),
        pytest.param(
            _edit(lambda d: _tool(d, "cuda-host-compiler").update(version=GCC_BANNER)),
            f"(cuda-host-compiler): version: expected the tool's exact version, a number "
            f"major.minor.patch (cmake/write_sbom.py), not a banner; got {GCC_BANNER!r}",
            id="tool-version-a-banner",
        ),
        pytest.param(
            _edit(lambda d: _tool(d, "nvcc").update(version="13.0")),
            "(nvcc): version: expected the tool's exact version, a number major.minor.patch",
            id="tool-version-a-release",
        ),
        pytest.param(
            _edit(lambda d: _tool(d, "cmake").update(version="cmake version 4.4.5")),
            "(cmake): version: expected the tool's exact version",
            id="tool-version-with-its-name",
        ),
        pytest.param(
            _edit(lambda d: _tool(d, "cyclonedx-python-lib").update(hashes=MADE_UP_SHA256)),
            "(cyclonedx-python-lib): hashes: expected none (cmake/write_sbom.py has no file",
            id="tool-made-up-hash",
        ),
        pytest.param(
            _edit(lambda d: d["metadata"]["tools"]["components"].remove(_tool(d, "cmake"))),
            "metadata.tools: expected the tools ['cmake', 'cuda-host-compiler', "
            "'cyclonedx-python-lib', 'nanobind', 'nvcc', 'scikit-build-core', 'zig'] "
            "(cmake/write_sbom.py, a build with a toolchain record); got none of ['cmake']",
            id="tool-left-out",
        ),
        pytest.param(
            _edit(
                lambda d: d["metadata"]["tools"]["components"].append(
                    {**_tool(d, "zig"), "bom-ref": "tool:zig again"}
                )
            ),
            "metadata.tools: expected zig once; got it 2 times",
            id="tool-twice",
        ),
        pytest.param(
            _edit(
                lambda d: d["metadata"]["tools"]["components"].append(
                    {"type": "application", "name": "gcc", "version": "14.2"}
                )
            ),
            "(gcc): expected only the tools ['cmake', 'cuda-host-compiler', ",
            id="tool-made-up",
        ),
        pytest.param(
            _edit(lambda d: d["metadata"].update(tools=[{"name": "zig", "version": "0.17.1"}])),
            "metadata.tools: expected an object of the tools' components only "
            '(cmake/write_sbom.py); got [{"name": "zig", "version": "0.17.1"}]',
            id="tools-in-the-legacy-list",
        ),
        pytest.param(
            _edit(lambda d: d["metadata"]["tools"].update(services=[{"name": "builder"}])),
            "metadata.tools: expected an object of the tools' components only "
            "(cmake/write_sbom.py); got ['components', 'services']",
            id="tools-with-services",
        ),
    ],
)
def test_a_planted_lie_fails_the_payload_gate(built_wheel, manifest, tmp_path, change, named):
    wheel = _rewritten(built_wheel, tmp_path, change)
    problems = _problems(wheel, manifest)
    assert any(named in problem for problem in problems), problems
    if "the SBOM says" in named:  # a lying version is reported as that, not as a made-up part
        assert "no module of the wheel records it" not in " ".join(problems)


@pytest.mark.parametrize(
    ("component", "needed", "linkage"),
    [
        ("cudart", ["libcudart.so.13", "libc.so.6"], "dynamic"),
        ("cudart", ["libcudart-1a2b3c4d.so.13.0.48"], "dynamic"),  # as auditwheel vendors it
        ("cudart", ["libcudart-1a2b3c4d5.so.13"], "dynamic"),  # a suffix of another length
        ("cudart", ["/opt/x/libcudart.so"], "dynamic"),  # a library linked without a soname
        ("cudart", ["./libcudart.so.13a"], "dynamic"),
        ("cudart", ["libcudart_static.so", "libcudartx.so.13"], "static"),
        ("libunwind", ["libc++.so.1"], "dynamic"),  # libc++'s library loads the other two
        ("libc++abi", ["libc++abi.so.1"], "dynamic"),
        ("libc++", ["libc++abi.so.1"], "static"),
        ("libstdc++", ["libstdc++.so.6"], "dynamic"),
        ("nanobind", ["libnanobind.so"], "static"),  # header code: always compiled in
    ],
)
def test_linkage_is_read_from_dt_needed(component, needed, linkage):
    assert expected_linkage(component, needed) == linkage


def test_the_gate_reads_dt_needed_from_the_module(engine_bytes):
    needed = module_needed(engine_bytes)
    assert "libc.so.6" in needed
    assert not any(name.startswith("libcudart") for name in needed)  # cudart linked in
    # As the loader reads it: from the dynamic segment, whatever the section headers say.
    renamed = engine_bytes.replace(b".dynamic\0", b".dynamiX\0")
    assert renamed != engine_bytes and module_needed(renamed) == needed


def test_a_library_the_module_loads_but_the_sbom_leaves_out_fails(
    built_wheel, manifest, monkeypatch
):
    """Were the modules to load cudart and libc++ at run time, the SBOM that says they link
    them in would lie; were they to load libstdc++, it would leave out what they load."""
    loads = ["libcudart-1a2b3c4d.so.13", "libc++.so.1", "libc.so.6"]
    monkeypatch.setattr("release.gates.sbom.module_needed", lambda data: loads)
    problems = " ".join(_problems(built_wheel, manifest))
    assert "(cudart@13.0:static): activekv:linkage: expected dynamic" in problems
    assert "(libc++abi@" in problems and "activekv:linkage: expected dynamic" in problems
    monkeypatch.setattr("release.gates.sbom.module_needed", lambda data: ["libstdc++.so.6"])
    problems = " ".join(_problems(built_wheel, manifest))
    assert (
        "loads libstdc++ at run time (DT_NEEDED ['libstdc++.so.6']); expected a component"
        in problems
    )


def test_an_unreadable_dynamic_segment_is_refused_not_raised(engine_bytes):
    elf = ELFFile(io.BytesIO(engine_bytes))
    (index,) = [i for i, s in enumerate(elf.iter_segments()) if s["p_type"] == "PT_DYNAMIC"]
    at = elf.header["e_phoff"] + index * elf.header["e_phentsize"] + 8  # Elf64_Phdr.p_offset
    broken = engine_bytes[:at] + (1 << 40).to_bytes(8, "little") + engine_bytes[at + 8 :]
    with pytest.raises(FactError, match="DT_NEEDED: expected a readable dynamic segment"):
        module_needed(broken)


@pytest.fixture(scope="module")
def engine_bytes(built_wheel: Path) -> bytes:
    with zipfile.ZipFile(built_wheel) as archive:
        (engine,) = [n for n in archive.namelist() if n.startswith("activekv/_engine.cpython")]
        return archive.read(engine)


# Facts planted in the real module (same length, so the ELF file stays whole): each is refused
# naming the fact and the form expected, as cmake/write_sbom.py refuses to describe it.
PLANTED_FACTS = [
    pytest.param(b"robin_map=1.4.0", b"robin_map:1.4.0", "expected name=value; got", id="no-="),
    pytest.param(b"nanobind=3.1.0", b"nanobind=3.1.\xff", "expected UTF-8 name=value;", id="utf-8"),
    pytest.param(
        b"\0cuda_runtime=13000\0",  # recorded twice in this module: the first changed
        b"\0cuda_runtime=12080\0",
        "cuda_runtime: expected one value; got '12080' and '13000'",
        id="two-values",
    ),
    pytest.param(
        b"cxx_runtime=libc++ 220108",
        b"cxx_runtime=libc++ 22O108",
        "cxx_runtime: expected 'libc++ <_LIBCPP_VERSION>' or 'libstdc++ <_GLIBCXX_RELEASE>'",
        id="libcxx-version-not-digits",
    ),
    pytest.param(
        b"cxx_runtime=libc++ 220108",
        b"cxx_runtime=msvcrt 220108",
        "cxx_runtime: expected 'libc++ <_LIBCPP_VERSION>' or",
        id="unknown-runtime",
    ),
    pytest.param(
        b"cuda_runtime=13000",
        b"cuda_runtime=13.00",
        "cuda_runtime: expected <CUDART_VERSION> (decimal digits); got '13.00'",
        id="cuda-version-not-digits",
    ),
    pytest.param(
        b"nanobind=3.1.0",
        b"nanobind=3.1.x",
        "nanobind: expected <major>.<minor>.<patch>",
        id="nanobind-version-not-a-version",
    ),
    pytest.param(
        b"robin_map=1.4.0",
        b"robin_mop=1.4.0",
        "expected only the facts ['cuda_architectures',",
        id="unknown-fact",
    ),
    pytest.param(
        b"robin_map=1.4.0",
        b"\0" * 15,
        "expected the facts ['robin_map'] (bindings/build_facts.h)",
        id="fact-missing",
    ),
]


@pytest.mark.parametrize(("real", "planted", "why"), PLANTED_FACTS)
def test_a_malformed_fact_is_refused_naming_it(engine_bytes, real, planted, why):
    assert len(real) == len(planted) and real in engine_bytes
    with pytest.raises(FactError) as refused:
        module_facts(engine_bytes.replace(real, planted, 1))
    assert why in str(refused.value)


def test_a_module_with_a_malformed_fact_fails_the_payload_gate(built_wheel, manifest, tmp_path):
    patched = tmp_path / built_wheel.name
    with zipfile.ZipFile(built_wheel) as source, zipfile.ZipFile(patched, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.startswith("activekv/_engine.cpython"):
                data = data.replace(b"cuda_runtime=13000", b"cuda_runtime=13.00", 1)
            info.compress_type = zipfile.ZIP_STORED
            target.writestr(info, data)
    (problem,) = _problems(patched, manifest)
    assert ".so: .activekv_sbom: cuda_runtime: expected <CUDART_VERSION>" in problem


@pytest.mark.parametrize(
    ("name", "why"),
    [
        pytest.param("x/../activekv.cdx.json", "the name has a '..' part", id="dot-dot"),
        pytest.param("other.cdx.json", "an SBOM the manifest does not name", id="another-sbom"),
    ],
)
def test_a_second_sbom_beside_the_real_one_fails(built_wheel, manifest, tmp_path, name, why):
    """An installer writes `sboms/x/../activekv.cdx.json` over the judged SBOM; any other SBOM
    would ship unjudged: either is refused by name, before its (lying) content is read."""
    wheel = _rewritten(built_wheel, tmp_path, lambda document: document)
    lie = _set_version("libc++", "17.0.6")(_sbom(built_wheel))
    member = f"activekv-0.1.0.dist-info/sboms/{name}"
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr(member, json.dumps(lie))
    bad = {e.path: e.problem for e in list_wheel(wheel, manifest) if e.kind == "sbom"}
    assert bad == {MEMBER: "", member: bad[member]}
    assert bad[member].startswith(why), bad


def _write_sbom(tmp_path: Path, wheel: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """cmake/write_sbom.py run as CMake runs it, over the wheel's own modules."""
    modules = []
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".so"):
                archive.extract(name, tmp_path / "modules")
                import_name = name.split(".")[0].replace("/", ".")
                modules += ["--module", f"{import_name}={name}={tmp_path / 'modules' / name}"]
    command = [sys.executable, REPO / "cmake" / "write_sbom.py"]
    command += writer_arguments(tmp_path / "sbom.json", modules, extra)
    return subprocess.run(
        list(map(str, command)),
        capture_output=True,
        text=True,
        env={"SOURCE_DATE_EPOCH": "1700000000", "PATH": "/usr/bin:/bin"},
    )


def test_without_a_record_the_sbom_names_the_tools_cmake_ran(built_wheel, tmp_path):
    first = _write_sbom(tmp_path, built_wheel)
    assert first.returncode == 0, first.stderr
    document = json.loads((tmp_path / "sbom.json").read_text())
    tools = {t["name"]: t for t in document["metadata"]["tools"]["components"]}
    assert tools["cxx-compiler"]["version"] == "22.1.8"  # CMake's "Clang 22.1.8", its number
    assert "hashes" not in tools["nanobind"]  # no distribution file to hash without a record
    assert document["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"
    again = (tmp_path / "sbom.json").read_bytes()
    assert _write_sbom(tmp_path, built_wheel).returncode == 0
    assert (tmp_path / "sbom.json").read_bytes() == again  # the same inputs, the same bytes


def test_a_record_that_names_other_tools_stops_the_build(built_wheel, tmp_path):
    record = _toolchain_record(built_wheel)
    (tmp_path / "record.json").write_text(json.dumps(record))
    done = _write_sbom(tmp_path, built_wheel, "--toolchain-record", str(tmp_path / "record.json"))
    assert done.returncode == 1
    assert "toolchain record: cmake_sha256: expected what this build ran" in done.stderr
    assert not (tmp_path / "sbom.json").exists()


def test_a_record_without_a_tool_stops_the_build(built_wheel, tmp_path):
    record = _toolchain_record(built_wheel)
    del record["zig_sha256"]
    (tmp_path / "record.json").write_text(json.dumps(record))
    done = _write_sbom(tmp_path, built_wheel, "--toolchain-record", str(tmp_path / "record.json"))
    assert done.returncode == 1
    assert "toolchain record: expected the keys ['zig_sha256']" in done.stderr
