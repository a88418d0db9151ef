"""A wheel's SBOM (PEP 770, `<dist-info>/sboms/`) judged against the wheel itself.

The payload gate calls :func:`sbom_problems` for the manifest's `payload.sbom` file of every wheel.
The document must validate against the CycloneDX 1.6 schema, name the wheel's distribution and
version, and name each native module of the wheel with what that module links in. What a module
links in is read here from the module, independently of cmake/write_sbom.py that wrote the
document: the facts its code recorded in the ELF section `.activekv_sbom`
(engine/common/sbom_facts.h). A component the SBOM lists with another version, or that no module
records, or a module it leaves out, is a problem naming it.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import PurePosixPath
from typing import Any

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from packaging.utils import parse_wheel_filename

FACT_SECTION = ".activekv_sbom"


def module_facts(data: bytes) -> dict[str, str]:
    """The `name=value` facts a native module recorded; empty when it recorded none."""
    try:
        section = ELFFile(io.BytesIO(data)).get_section_by_name(FACT_SECTION)
    except ELFError:
        return {}
    if section is None:
        return {}
    entries = (entry.decode(errors="replace") for entry in section.data().split(b"\0") if entry)
    return dict(entry.partition("=")[::2] for entry in entries)


def expected_components(facts: dict[str, str]) -> dict[str, str]:
    """Component name -> version, for what the facts say a module links in."""
    expected: dict[str, str] = {}
    runtime, _, number = facts.get("cxx_runtime", "").partition(" ")
    if runtime == "libc++" and number.isdigit():
        value = int(number)  # _LIBCPP_VERSION: MMmmpp
        version = f"{value // 10000}.{value // 100 % 100}.{value % 100}"
        expected.update(dict.fromkeys(("libc++", "libc++abi", "libunwind"), version))
    elif runtime == "libstdc++":
        expected["libstdc++"] = number
    if (cuda := facts.get("cuda_runtime", "")).isdigit():
        expected["cudart"] = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"  # CUDART_VERSION
    for fact, name in (("nanobind", "nanobind"), ("robin_map", "robin-map")):
        if fact in facts:
            expected[name] = facts[fact]
    return expected


def _schema_problem(text: str) -> str:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is None:
        return ""
    detail = str(getattr(error.data, "message", error.data))
    where = "/".join(str(part) for part in getattr(error.data, "absolute_path", ())) or "the top"
    short = detail if len(detail) <= 160 else detail[:160] + "…"
    return f"does not validate against the CycloneDX 1.6 schema at {where}: {short}"


def _properties(component: dict[str, Any]) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in component.get("properties", [])}


def sbom_problems(archive: zipfile.ZipFile, member: str, wheel_name: str) -> list[str]:
    """Everything wrong with the SBOM `member` of the open wheel `archive`."""
    text = archive.read(member).decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        return [f"not JSON ({error})"]
    if problem := _schema_problem(text):
        return [problem]
    if document.get("specVersion") != "1.6":
        return [f"specVersion: expected 1.6; got {document.get('specVersion')!r}"]

    problems: list[str] = []
    name, version, _, _ = parse_wheel_filename(wheel_name)
    package = document.get("metadata", {}).get("component", {})
    if (package.get("name"), package.get("version")) != (str(name), str(version)):
        problems.append(
            f"metadata.component: expected {name} {version} (the wheel's); "
            f"got {package.get('name')} {package.get('version')}"
        )

    components = document.get("components", [])
    by_ref = {c.get("bom-ref"): c for c in components}
    depends = {d.get("ref"): d.get("dependsOn", []) for d in document.get("dependencies", [])}
    by_file = {_properties(c)["activekv:file"]: c for c in components if "activekv:file" in
               _properties(c)}  # fmt: skip
    modules = [info.filename for info in archive.infolist() if info.filename.endswith(".so")]
    checked: set[str] = set()
    for path in modules:
        facts = module_facts(archive.read(path))
        import_name = ".".join(
            PurePosixPath(path).with_name(PurePosixPath(path).name.split(".")[0]).parts
        )
        module = by_file.get(path)
        if not facts:
            problems.append(f"{path} records no {FACT_SECTION} facts to check its SBOM entry by")
        elif module is None or module.get("name") != import_name:
            problems.append(f"{path}: expected a component {import_name} for this module; missing")
        else:
            checked.add(module.get("bom-ref"))
            problems += _module_problems(module, path, import_name, facts, by_ref, depends, checked)
    for path in sorted(set(by_file) - set(modules)):
        problems.append(f"{by_file[path].get('name')}: names {path}, which the wheel does not hold")
    for component in components:
        if component.get("bom-ref") not in checked and "activekv:file" not in _properties(
            component
        ):
            problems.append(
                f"{component.get('name')} {component.get('version')}: listed, but no module of "
                "the wheel records it"
            )
    return problems


def _module_problems(
    module: dict[str, Any],
    path: str,
    import_name: str,
    facts: dict[str, str],
    by_ref: dict[Any, dict[str, Any]],
    depends: dict[Any, list[Any]],
    checked: set[str],
) -> list[str]:
    """One module's entry against its facts; the refs of what it lists go to `checked`."""
    problems: list[str] = []
    architectures = _properties(module).get("activekv:cuda_architectures")
    if architectures != facts.get("cuda_architectures", ""):
        problems.append(
            f"{import_name}: activekv:cuda_architectures: expected "
            f"{facts.get('cuda_architectures', '')!r} (compiled in); got {architectures!r}"
        )
    listed = {
        by_ref[ref].get("name"): (ref, by_ref[ref].get("version"))
        for ref in depends.get(module.get("bom-ref"), [])
        if ref in by_ref
    }
    for part, truth in expected_components(facts).items():
        ref, said = listed.get(part, (None, None))
        if ref is None:
            problems.append(f"{import_name}: expected the component {part} {truth}; missing")
            continue
        if said != truth:
            problems.append(f"{part}: the SBOM says {said}; {path} was built with {truth}")
        checked.add(ref)
    return problems
