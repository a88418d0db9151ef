"""A wheel's SBOM (PEP 770, `<dist-info>/sboms/`) judged against the wheel itself.

The payload gate calls :func:`sbom_problems` for the manifest's `payload.sbom` file of every wheel.
The document must be unambiguous JSON (strict UTF-8, no repeated keys, no NaN or Infinity),
validate against the CycloneDX 1.6 schema, name the wheel's distribution and version (its purl
too), and name each native module of the wheel with exactly what that module links in. What a
module links in is read from the module itself, independently of cmake/write_sbom.py that wrote
the document (release/gates/sbom_facts.py: the facts its code recorded in the ELF section
`.activekv_sbom`). The package carries the licence METADATA gives (License-Expression), each
module the SHA-256 of its file in the wheel, each library the identifiers, licence and supplier
the writer gives it, and the build tools their exact versions (a version number, never a banner)
and the digests the writer gives them. A component the SBOM
lists with another version, or that no module records, or a module it leaves out, or a fact it
cannot be judged by, is a problem naming it.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL
from packaging.utils import parse_wheel_filename

from release.gates.licenses import read_metadata
from release.gates.sbom_facts import (
    FACT_SECTION,
    FactError,
    components_loaded,
    expected_components,
    expected_linkage,
    module_facts,
    module_needed,
)
from release.util.jsonfile import JsonFileError, refuse_constant

# Who each library a module may link is to scanners (cmake/write_sbom.py writes these): the
# package URL's (type, namespace, name) and the prefix of its version (a release tag), and the
# CPE's vendor:product; None where it has none.
_LLVM = (("github", "llvm", "llvm-project"), "llvmorg-", "llvm:llvm")
_IDENTITIES: dict[str, tuple[tuple[str, str | None, str] | None, str, str | None]] = {
    "libc++": _LLVM,
    "libc++abi": _LLVM,
    "libunwind": _LLVM,
    "libstdc++": (None, "", "gnu:gcc"),
    "cudart": (None, "", "nvidia:cuda_toolkit"),
    "nanobind": (("pypi", None, "nanobind"), "", None),
    "robin-map": (("github", "tessil", "robin-map"), "v", None),
}
# The licence (its one `licenses` entry) and supplier cmake/write_sbom.py gives each of those
# libraries, compared whole: a scanner's licence report reads exactly these.
_LLVM_PROVENANCE = ({"expression": "Apache-2.0 WITH LLVM-exception"}, "LLVM Project")
_PROVENANCE: dict[str, tuple[dict[str, Any], str]] = {
    "libc++": _LLVM_PROVENANCE,
    "libc++abi": _LLVM_PROVENANCE,
    "libunwind": _LLVM_PROVENANCE,
    "libstdc++": ({"expression": "GPL-3.0-only WITH GCC-exception-3.1"}, "GNU Project"),
    "cudart": (
        {"license": {"name": "NVIDIA CUDA Toolkit End User License Agreement"}},
        "NVIDIA",
    ),
    "nanobind": ({"expression": "BSD-3-Clause"}, "Wenzel Jakob"),
    "robin-map": ({"expression": "MIT"}, "Tessil"),
}


class _Tool(NamedTuple):
    """What cmake/write_sbom.py gives one build tool: a version, a sha256, and whether every
    build of that kind names the tool."""

    version: bool
    sha256: bool
    required: bool = True


# The tools (metadata.tools.components) the writer names: with the pipeline's toolchain record,
# each with the version and sha256 the record holds; without one (a plain `pip wheel .`,
# cibuildwheel in CI), the compilers and cmake CMake ran, hashed, the host compiler unversioned
# (and only when CUDA names one), nanobind and scikit-build-core by version alone. Either way
# cyclonedx-python-lib names itself, versioned, unhashed.
_RECORDED_TOOLS = {
    **dict.fromkeys(
        ("zig", "nvcc", "cuda-host-compiler", "cmake", "nanobind", "scikit-build-core"),
        _Tool(version=True, sha256=True),
    ),
    "cyclonedx-python-lib": _Tool(version=True, sha256=False),
}
_OBSERVED_TOOLS = {
    "cxx-compiler": _Tool(version=True, sha256=True),
    "nvcc": _Tool(version=True, sha256=True),
    "cuda-host-compiler": _Tool(version=False, sha256=True, required=False),
    "cmake": _Tool(version=True, sha256=True),
    "nanobind": _Tool(version=True, sha256=False),
    "scikit-build-core": _Tool(version=True, sha256=False),
    "cyclonedx-python-lib": _Tool(version=True, sha256=False),
}
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A tool's exact version as cmake/write_sbom.py gives it (TOOL_VERSION there): major.minor.patch,
# perhaps with a pre-release or build suffix; never a `--version` banner or a release ("13.0").
_TOOL_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:[-+~][0-9A-Za-z.+~-]+)?")
Component = dict[str, Any]


# --- the document: unambiguous JSON, valid CycloneDX 1.6 ---


class _RepeatedKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = Counter(key for key, _ in pairs)
    if repeated := [key for key, count in keys.items() if count > 1]:
        raise _RepeatedKey(repeated[0])
    return dict(pairs)


def _document(data: bytes) -> tuple[dict[str, Any], str]:
    """The parsed document, or the problem that stops it from being judged."""
    try:
        text = data.decode("utf-8")
        document = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=refuse_constant)
    except UnicodeDecodeError as error:
        return {}, f"not UTF-8: expected UTF-8 JSON; got {error.reason} at byte {error.start}"
    except _RepeatedKey as error:
        return {}, f"ambiguous JSON: expected each key once in an object; got {str(error)!r} twice"
    except JsonFileError as error:  # NaN or Infinity
        return {}, f"not JSON: {error}"
    except RecursionError:
        return {}, "not JSON this gate can read: expected a document; got nesting too deep"
    except ValueError as error:
        return {}, f"not JSON ({error})"
    if problem := _schema_problem(text):
        return {}, problem
    if document.get("specVersion") != "1.6":
        return {}, f"specVersion: expected 1.6; got {document.get('specVersion')!r}"
    return document, ""


def _clip(text: str, limit: int) -> str:
    """`text`, its middle left out when longer than `limit`."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]} … {text[-limit // 2 :]}"


def _schema_problem(text: str) -> str:
    try:
        error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    except RecursionError:
        return (
            "does not validate against the CycloneDX 1.6 schema: expected a document the "
            "validator can read; got nesting too deep"
        )
    if error is None:
        return ""
    detail = str(getattr(error.data, "message", error.data))
    shown = repr(getattr(error.data, "instance", None))
    if detail.startswith(shown):  # "<instance> is not …": the instance clipped, the reason kept
        detail = _clip(shown, 120) + _clip(detail[len(shown) :], 400)
    else:
        detail = _clip(detail, 520)
    where = "/".join(str(part) for part in getattr(error.data, "absolute_path", ())) or "the top"
    return f"does not validate against the CycloneDX 1.6 schema at {where}: {detail}"


# --- the document's own consistency: one reading of every ref, file and property ---


def _properties(component: Component) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in component.get("properties", [])}


def _file(component: Component) -> str | None:
    return _properties(component).get("activekv:file")


def _listed(document: dict[str, Any]) -> Iterator[tuple[str, Component]]:
    """The listed components (`components`) with where each is."""
    for index, component in enumerate(document.get("components", [])):
        yield f"components[{index}] ({component.get('name')})", component


def _tools(document: dict[str, Any]) -> list[Component]:
    """The tools' components; none in the schema's legacy list of tools, which _tool_problems
    refuses (the writer never gives one)."""
    tools = document.get("metadata", {}).get("tools", {})
    return tools.get("components", []) if isinstance(tools, dict) else []


def _everywhere(document: dict[str, Any]) -> Iterator[tuple[str, Component]]:
    """Every component of the document with where it is: the package, the listed components and
    the tools."""
    metadata = document.get("metadata", {})
    if "component" in metadata:
        yield "metadata.component", metadata["component"]
    yield from _listed(document)
    for index, tool in enumerate(_tools(document)):
        yield f"metadata.tools.components[{index}] ({tool.get('name')})", tool


def _repeated(values: list[Any]) -> list[tuple[Any, int]]:
    return [(value, count) for value, count in Counter(values).items() if count > 1]


def _structure_problems(document: dict[str, Any]) -> list[str]:
    """Nested components, a bom-ref, module file, property or dependency entry given twice, and
    refs no component has: each would let the gate read the document one way and a consumer
    another."""
    problems: list[str] = []
    everything = list(_everywhere(document))
    for where, component in everything:
        if "components" in component:
            problems.append(
                f"{where}: expected no nested components (cmake/write_sbom.py lists every one "
                f"at the top); got {len(component['components'])}"
            )
        names = [p.get("name") for p in component.get("properties", [])]
        for name, count in _repeated(names):
            problems.append(f"{where}: properties: expected {name!r} once; got it {count} times")
    for ref, count in _repeated([c["bom-ref"] for _, c in everything if "bom-ref" in c]):
        problems.append(f"bom-ref {ref!r}: expected one component with it; got {count}")
    files = [_file(c) for c in document.get("components", []) if _file(c) is not None]
    for path, count in _repeated(files):
        problems.append(f"activekv:file {path!r}: expected one component with it; got {count}")
    return problems + _dependency_problems(document, {c.get("bom-ref") for _, c in everything})


def _dependency_problems(document: dict[str, Any], refs: set[Any]) -> list[str]:
    dependencies = document.get("dependencies", [])
    problems = [
        f"dependencies: expected one entry for {ref!r}; got {count}"
        for ref, count in _repeated([d.get("ref") for d in dependencies])
    ]
    for dependency in dependencies:
        ref = dependency.get("ref")
        if ref not in refs:
            problems.append(f"dependencies: ref {ref!r}: expected a component's bom-ref; got none")
        for target in dependency.get("dependsOn", []):
            if target not in refs:
                problems.append(
                    f"dependencies: {ref!r} dependsOn {target!r}: expected a component's "
                    "bom-ref; got none"
                )
    return problems


def _identifier_problems(where: str, component: Component) -> list[str]:
    """A listed component's purl and CPE: for a library a module may link, who it is
    (_IDENTITIES, so that a scanner matches it to that library) at its own version, with the
    licence and supplier the writer gives it and no digest; anything else (a module) has neither
    identifier, as the writer gives it none, lest a scanner take it for another package."""
    name = component.get("name")
    if name not in _IDENTITIES:
        return [
            f"{where}: {key}: expected none (cmake/write_sbom.py gives {name} none); "
            f"got {component[key]!r}"
            for key in ("purl", "cpe")
            if key in component
        ]
    return _library_identifier_problems(where, component) + _provenance_problems(where, component)


def _library_identifier_problems(where: str, component: Component) -> list[str]:
    name, version = component.get("name"), str(component.get("version"))
    identity, tag, vendor_product = _IDENTITIES[name]
    problems: list[str] = []
    purl, cpe = component.get("purl"), component.get("cpe")
    if (purl is None) != (identity is None):
        expected = "no purl" if identity is None else "a purl"
        problems.append(f"{where}: purl: expected {expected} for {name}; got {purl!r}")
    elif purl is not None and identity is not None:
        problems += _purl_problems(where, purl, identity, tag + version)
    if (cpe is None) != (vendor_product is None):
        expected = "no CPE" if vendor_product is None else f"the CPE of {vendor_product}"
        problems.append(f"{where}: cpe: expected {expected} for {name}; got {cpe!r}")
    elif cpe is not None and vendor_product is not None:
        problems += _cpe_problems(where, cpe, vendor_product, version)
    return problems


def _provenance_problems(where: str, component: Component) -> list[str]:
    """The licence and supplier the writer gives the library (_PROVENANCE), and no digest: the
    writer hashes no library, so a digest on one is made up."""
    licence, supplier = _PROVENANCE[component.get("name")]
    problems: list[str] = []
    for key, expected in (("licenses", [licence]), ("supplier", {"name": supplier})):
        if component.get(key) != expected:
            problems.append(
                f"{where}: {key}: expected {_json(expected)} (cmake/write_sbom.py); "
                f"got {_json(component.get(key))}"
            )
    if "hashes" in component:
        problems.append(
            f"{where}: hashes: expected none (cmake/write_sbom.py hashes no library); "
            f"got {_json(component['hashes'])}"
        )
    return problems


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _purl_problems(
    where: str, text: str, identity: tuple[str, str | None, str], version: str
) -> list[str]:
    try:
        purl = PackageURL.from_string(text)
    except ValueError as error:
        return [f"{where}: purl: expected a package URL; got {text!r} ({error})"]
    if (purl.type, purl.namespace, purl.name) != identity:
        return [f"{where}: purl: expected pkg:{'/'.join(filter(None, identity))}; got {text!r}"]
    if purl.version != version:
        return [f"{where}: purl: expected the version {version}; got {text!r}"]
    return []


def _cpe_problems(where: str, cpe: str, vendor_product: str, version: str) -> list[str]:
    fields = [re.sub(r"\\(.)", r"\1", f) for f in re.split(r"(?<!\\):", cpe)]
    if len(fields) != 13 or fields[:3] != ["cpe", "2.3", "a"]:
        return [f"{where}: cpe: expected a CPE 2.3 formatted string; got {cpe!r}"]
    if ":".join(fields[3:5]) != vendor_product:
        return [f"{where}: cpe: expected vendor:product {vendor_product}; got {cpe!r}"]
    if fields[5] != version:
        return [f"{where}: cpe: expected the version {version}; got {cpe!r}"]
    return []


def _package_identifier_problems(package: Component, name: str, version: str) -> list[str]:
    """metadata.component: the wheel's own purl (compared as parsed, so an encoding of the same
    purl passes) and no CPE, as the writer gives it: a scanner reads the package by these."""
    expected = PackageURL("pypi", None, name, version).to_string()
    problems: list[str] = []
    said = package.get("purl")
    try:
        same = said is not None and PackageURL.from_string(said).to_string() == expected
    except ValueError:
        same = False
    if not same:
        problems.append(
            f"metadata.component: purl: expected {expected} (the wheel's); got {said!r}"
        )
    if "cpe" in package:
        problems.append(
            f"metadata.component: cpe: expected none (cmake/write_sbom.py gives the package "
            f"none); got {package['cpe']!r}"
        )
    return problems


def _package_licence_problems(
    package: Component, archive: zipfile.ZipFile, wheel_name: str
) -> list[str]:
    """metadata.component's licence: exactly the SPDX expression METADATA's License-Expression
    gives (PEP 639), so a scanner reads the package's licence where it reads the libraries'."""
    metadata = read_metadata(archive, wheel_name) or {}
    expression = metadata.get("license_expression")
    said = package.get("licenses")
    if not expression:
        return [
            f"metadata.component: licenses: expected the wheel's License-Expression; METADATA "
            f"gives none (the SBOM says {_json(said)})"
        ]
    if said != [{"expression": expression}]:
        return [
            f"metadata.component: licenses: expected {_json([{'expression': expression}])} "
            f"(METADATA's License-Expression); got {_json(said)}"
        ]
    return []


# --- the build tools ---


def _tool_problems(document: dict[str, Any]) -> list[str]:
    """metadata.tools as the writer gives it: a `components` list of the tools of a build with a
    toolchain record (_RECORDED_TOOLS) or of one without (_OBSERVED_TOOLS), each named once and
    each with the version and sha256 the writer gives it, and no other tool."""
    tools = document.get("metadata", {}).get("tools")
    if not isinstance(tools, dict) or set(tools) != {"components"}:
        shown = sorted(tools) if isinstance(tools, dict) else _clip(_json(tools), 120)
        return [
            "metadata.tools: expected an object of the tools' components only "
            f"(cmake/write_sbom.py); got {shown}"
        ]
    names = [tool.get("name") for tool in tools["components"]]
    recorded = "zig" in names  # only a build with a toolchain record names zig
    expected = _RECORDED_TOOLS if recorded else _OBSERVED_TOOLS
    build = "a build with a toolchain record" if recorded else "a build without a toolchain record"
    problems = [
        f"metadata.tools: expected {name} once; got it {count} times"
        for name, count in _repeated(names)
    ]
    required = sorted(name for name, tool in expected.items() if tool.required)
    if missing := sorted(set(required) - set(names)):
        problems.append(
            f"metadata.tools: expected the tools {required} (cmake/write_sbom.py, {build}); "
            f"got none of {missing}"
        )
    for index, tool in enumerate(tools["components"]):
        where = f"metadata.tools.components[{index}] ({tool.get('name')})"
        if tool.get("name") not in expected:
            problems.append(
                f"{where}: expected only the tools {sorted(expected)} (cmake/write_sbom.py, "
                f"{build}); got {tool.get('name')!r}"
            )
        else:
            problems += _one_tool_problems(where, tool, expected[tool.get("name")])
    return problems


def _one_tool_problems(where: str, tool: Component, expected: _Tool) -> list[str]:
    """One tool's version and sha256, each there exactly when the writer gives it."""
    problems: list[str] = []
    version = tool.get("version")
    if expected.version and not (
        isinstance(version, str) and _TOOL_VERSION.fullmatch(version) is not None
    ):
        problems.append(
            f"{where}: version: expected the tool's exact version, a number major.minor.patch "
            f"(cmake/write_sbom.py), not a banner; got {version!r}"
        )
    if not expected.version and version is not None:
        problems.append(
            f"{where}: version: expected none (cmake/write_sbom.py has none to give); "
            f"got {version!r}"
        )
    hashes = tool.get("hashes")
    if expected.sha256 and not _one_sha256(hashes):
        problems.append(
            f"{where}: hashes: expected one SHA-256 of 64 lowercase hex digits, not all zero "
            f"(cmake/write_sbom.py); got {_json(hashes)}"
        )
    if not expected.sha256 and hashes is not None:
        problems.append(
            f"{where}: hashes: expected none (cmake/write_sbom.py has no file of it to hash); "
            f"got {_json(hashes)}"
        )
    return problems


def _one_sha256(hashes: Any) -> bool:
    """One SHA-256 of the writer's form. All zeros is no file's digest: it is what a scrubbed
    or placeholder digest reads, the one made-up value the gate can tell without the record."""
    if not isinstance(hashes, list) or len(hashes) != 1 or hashes[0].get("alg") != "SHA-256":
        return False
    content = hashes[0].get("content", "")
    return _SHA256.fullmatch(content) is not None and content != "0" * 64


# --- the document against the wheel ---


def sbom_problems(archive: zipfile.ZipFile, member: str, wheel_name: str) -> list[str]:
    """Everything wrong with the SBOM `member` of the open wheel `archive`."""
    document, problem = _document(archive.read(member))
    if problem:
        return [problem]
    if problems := _structure_problems(document):
        return problems  # the rest reads refs and files one way only

    name, version, _, _ = parse_wheel_filename(wheel_name)
    package = document.get("metadata", {}).get("component", {})
    if (package.get("name"), package.get("version")) != (str(name), str(version)):
        problems.append(
            f"metadata.component: expected {name} {version} (the wheel's); "
            f"got {package.get('name')} {package.get('version')}"
        )
    problems += _package_identifier_problems(package, str(name), str(version))
    problems += _package_licence_problems(package, archive, wheel_name)
    for where, component in _listed(document):
        problems += _identifier_problems(where, component)
    problems += _tool_problems(document)
    return problems + _wheel_problems(archive, document, str(version))


@dataclass
class _Reading:
    """The document read one way only (_structure_problems found no ref, module file or
    dependency entry given twice), and the refs of the components a module accounts for."""

    by_ref: dict[Any, Component]
    depends: dict[Any, list[Any]]
    by_file: dict[str, Component]
    version: str
    checked: set[Any] = field(default_factory=set)


def _wheel_problems(archive: zipfile.ZipFile, document: dict[str, Any], version: str) -> list[str]:
    """Each module of the wheel against its component, and every component against a module."""
    components = document.get("components", [])
    reading = _Reading(
        by_ref={c["bom-ref"]: c for _, c in _everywhere(document) if "bom-ref" in c},
        depends={d.get("ref"): d.get("dependsOn", []) for d in document.get("dependencies", [])},
        by_file={path: c for c in components if (path := _file(c)) is not None},
        version=version,
    )
    modules = [info.filename for info in archive.infolist() if info.filename.endswith(".so")]
    problems = [p for path in modules for p in _module_entry(reading, path, archive.read(path))]
    for path in sorted(set(reading.by_file) - set(modules)):
        name = reading.by_file[path].get("name")
        problems.append(f"{name}: names {path}, which the wheel does not hold")
    for component in components:
        if component.get("bom-ref") not in reading.checked and _file(component) is None:
            problems.append(
                f"{component.get('name')} {component.get('version')}: listed, but no module of "
                "the wheel records it"
            )
    return problems + _package_problems(document, reading.depends)


def _module_entry(reading: _Reading, path: str, data: bytes) -> list[str]:
    """The component of the module `path` (its bytes `data`) against the facts it recorded."""
    try:
        facts = module_facts(data)
    except FactError as error:
        return [f"{path}: {FACT_SECTION}: {error}"]
    if not facts:
        return [f"{path} records no {FACT_SECTION} facts to check its SBOM entry by"]
    import_name = ".".join(
        PurePosixPath(path).with_name(PurePosixPath(path).name.split(".")[0]).parts
    )
    module = reading.by_file.get(path)
    if module is None or module.get("name") != import_name:
        return [f"{path}: expected a component {import_name} for this module; missing"]
    reading.checked.add(module.get("bom-ref"))
    listed = [reading.by_ref[ref] for ref in reading.depends.get(module.get("bom-ref"), [])]
    truths = expected_components(facts)
    return (
        _module_problems(module, path, import_name, facts, reading.version)
        + _module_hash_problems(module, path, import_name, data)
        + _linked_problems(listed, path, import_name, truths, reading.checked)
        + _linkage_problems(listed, path, truths, data)
    )


def _module_problems(
    module: Component, path: str, import_name: str, facts: dict[str, str], version: str
) -> list[str]:
    """The module's own entry: the wheel's version and the architectures compiled in."""
    problems: list[str] = []
    if module.get("version") != version:
        problems.append(
            f"{import_name}: version: expected {version} (the wheel's); got {module.get('version')}"
        )
    architectures = _properties(module).get("activekv:cuda_architectures")
    if architectures != facts.get("cuda_architectures", ""):
        problems.append(
            f"{import_name}: activekv:cuda_architectures: expected "
            f"{facts.get('cuda_architectures', '')!r} (compiled in); got {architectures!r}"
        )
    return problems


def _module_hash_problems(module: Component, path: str, import_name: str, data: bytes) -> list[str]:
    """The module's one digest, the SHA-256 of the module as the wheel holds it (`data`): what a
    scanner matches an installed file to (the writer hashes the installed, stripped module)."""
    hashes = module.get("hashes")
    actual = hashlib.sha256(data).hexdigest()
    if (
        isinstance(hashes, list)
        and len(hashes) == 1
        and set(hashes[0]) == {"alg", "content"}
        and hashes[0]["alg"] == "SHA-256"
        and str(hashes[0]["content"]).lower() == actual  # hex of either case is that digest
    ):
        return []
    return [
        f"{import_name}: hashes: expected one SHA-256, that of {path} in the wheel ({actual}); "
        f"got {_json(hashes)}"
    ]


def _linked_problems(
    listed: list[Component], path: str, import_name: str, truths: dict[str, str], checked: set[Any]
) -> list[str]:
    """What the module depends on against what its facts say it links in (`truths`, name ->
    version), both ways; the refs of the parts its facts name go to `checked`."""
    problems: list[str] = []
    for part, count in _repeated([c.get("name") for c in listed]):
        problems.append(f"{import_name}: dependsOn: expected {part} once; got it {count} times")
    for component in listed:
        part, said = component.get("name"), component.get("version")
        if part not in truths:
            problems.append(
                f"{import_name}: dependsOn: expected only {sorted(truths)} (its facts); "
                f"got {part} {said}, which {path} does not record"
            )
            continue
        if said != truths[part]:
            problems.append(f"{part}: the SBOM says {said}; {path} was built with {truths[part]}")
        checked.add(component.get("bom-ref"))
    names = {c.get("name") for c in listed}
    for part, truth in truths.items():
        if part not in names:
            problems.append(f"{import_name}: expected the component {part} {truth}; missing")
    return problems


def _linkage_problems(
    listed: list[Component], path: str, truths: dict[str, str], data: bytes
) -> list[str]:
    """Each part its facts name (`truths`, name -> version), its activekv:linkage against the
    module's DT_NEEDED: "dynamic" only where the module loads that library at run time; and
    every library it loads listed."""
    try:
        needed = module_needed(data)
    except FactError as error:
        return [f"{path}: {error}"]
    problems: list[str] = []
    for component in listed:
        part = component.get("name")
        if part not in truths:
            continue  # _linked_problems refuses it
        said, truth = _properties(component).get("activekv:linkage"), expected_linkage(part, needed)
        if said != truth:
            how = "names" if truth == "dynamic" else "does not name"
            problems.append(
                f"{part} ({component.get('bom-ref')}): activekv:linkage: expected {truth} "
                f"({path} {how} it in DT_NEEDED {needed}); got {said!r}"
            )
    names = {c.get("name") for c in listed}
    for part in sorted(components_loaded(needed) - names):
        problems.append(
            f"{path}: loads {part} at run time (DT_NEEDED {needed}); expected a component for it "
            "in its dependsOn; missing"
        )
    return problems


def _package_problems(document: dict[str, Any], depends: dict[Any, list[Any]]) -> list[str]:
    """The package depends on its modules (the components naming a file), and on nothing else."""
    ref = document.get("metadata", {}).get("component", {}).get("bom-ref")
    modules = sorted(str(c.get("bom-ref")) for c in document.get("components", []) if _file(c))
    said = sorted(depends.get(ref, []))
    if said == modules:
        return []
    return [f"metadata.component: dependsOn: expected its modules {modules}; got {said}"]
