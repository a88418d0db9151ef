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
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from packageurl import PackageURL
from packaging.utils import parse_wheel_filename

from release.gates.licenses import read_metadata
from release.gates.sbom_document import Component, canonical_json, read_document, repeated
from release.gates.sbom_facts import (
    FACT_SECTION,
    FactError,
    components_loaded,
    expected_components,
    expected_linkage,
    module_facts,
    module_needed,
)
from release.gates.sbom_tools import tool_problems

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


def _properties(component: Component) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in component.get("properties", [])}


def _file(component: Component) -> str | None:
    return _properties(component).get("activekv:file")


def _listed(document: dict[str, Any]) -> Iterator[tuple[str, Component]]:
    """The listed components (`components`) with where each is."""
    for index, component in enumerate(document.get("components", [])):
        yield f"components[{index}] ({component.get('name')})", component


def _tools(document: dict[str, Any]) -> list[Component]:
    """The tools' components; none in the schema's legacy list of tools, which tool_problems
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
        for name, count in repeated(names):
            problems.append(f"{where}: properties: expected {name!r} once; got it {count} times")
    for ref, count in repeated([c["bom-ref"] for _, c in everything if "bom-ref" in c]):
        problems.append(f"bom-ref {ref!r}: expected one component with it; got {count}")
    files = [_file(c) for c in document.get("components", []) if _file(c) is not None]
    for path, count in repeated(files):
        problems.append(f"activekv:file {path!r}: expected one component with it; got {count}")
    return problems + _dependency_problems(document, {c.get("bom-ref") for _, c in everything})


def _dependency_problems(document: dict[str, Any], refs: set[Any]) -> list[str]:
    dependencies = document.get("dependencies", [])
    problems = [
        f"dependencies: expected one entry for {ref!r}; got {count}"
        for ref, count in repeated([d.get("ref") for d in dependencies])
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
                f"{where}: {key}: expected {canonical_json(expected)} (cmake/write_sbom.py); "
                f"got {canonical_json(component.get(key))}"
            )
    if "hashes" in component:
        problems.append(
            f"{where}: hashes: expected none (cmake/write_sbom.py hashes no library); "
            f"got {canonical_json(component['hashes'])}"
        )
    return problems


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
            f"gives none (the SBOM says {canonical_json(said)})"
        ]
    if said != [{"expression": expression}]:
        expected = canonical_json([{"expression": expression}])
        return [
            f"metadata.component: licenses: expected {expected} "
            f"(METADATA's License-Expression); got {canonical_json(said)}"
        ]
    return []


def sbom_problems(archive: zipfile.ZipFile, member: str, wheel_name: str) -> list[str]:
    """Everything wrong with the SBOM `member` of the open wheel `archive`."""
    document, problem = read_document(archive.read(member))
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
    problems += tool_problems(document)
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
        f"got {canonical_json(hashes)}"
    ]


def _linked_problems(
    listed: list[Component], path: str, import_name: str, truths: dict[str, str], checked: set[Any]
) -> list[str]:
    """What the module depends on against what its facts say it links in (`truths`, name ->
    version), both ways; the refs of the parts its facts name go to `checked`."""
    problems: list[str] = []
    for part, count in repeated([c.get("name") for c in listed]):
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
