"""Writes the wheel's CycloneDX 1.6 SBOM (PEP 770: `<name>.dist-info/sboms/activekv.cdx.json`).

Run by CMake when it installs the modules (bindings/CMakeLists.txt), with the build's own Python,
whose isolated environment holds the pinned cyclonedx-python-lib and pyelftools
(build-system.requires). What each module links in comes from the module itself: the facts its
code recorded in the ELF section `.activekv_sbom` from the headers the compiler really used
(engine/common/sbom_facts.h), and its DT_NEEDED entries (static or dynamic). Each module is read
as the wheel holds it (CMake runs this at install time, after `--strip`), so its SHA-256 is the
digest of the wheel's file. The package's licence is pyproject.toml's `project.license`. The
build tools come from the pipeline's toolchain record (the provenance's versions and digests),
each checked here against the tool CMake really ran; a build without a record (a plain
`pip wheel .`) names the tools CMake ran and hashes the binaries it can see. Every tool's version
is a version number (`13.0.88`), never a `--version` banner.

Bit-identical for identical inputs: no clock (the time is SOURCE_DATE_EPOCH, or none), no paths,
a serial number derived from the content, fixed bom-refs. docs/sbom.md describes the result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from cyclonedx.contrib.this.builders import this_component
from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.contact import OrganizationalEntity
from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from elftools.common.exceptions import ELFError
from elftools.construct.core import ConstructError
from elftools.elf.elffile import ELFFile
from packageurl import PackageURL

if sys.version_info >= (3, 11):
    import tomllib
else:  # scikit-build-core, in build-system.requires, brings tomli to Python 3.10
    import tomli as tomllib

FACT_SECTION = ".activekv_sbom"
# What the SBOM takes from a toolchain record (release/builder/toolchain.py: toolchain_record).
_TOOLS = ("zig", "nvcc", "cuda_host_compiler", "cmake", "nanobind", "scikit-build-core")
RECORDED = (*(f"{tool}{suffix}" for tool in _TOOLS for suffix in ("", "_sha256")), "nvcc_version")
# A tool's exact version: major.minor.patch, perhaps with a pre-release or build suffix
# ("0.16.0-dev.1+abc"); never a banner ("g++ (Debian 12.2.0-14) 12.2.0") nor a release ("13.0").
TOOL_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:[-+~][0-9A-Za-z.+~-]+)?")
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
LLVM_LICENSE = "Apache-2.0 WITH LLVM-exception"
# The latest second a timestamp can hold (9999-12-31T23:59:59Z): Python's datetime, and what GCC
# and Clang accept as SOURCE_DATE_EPOCH.
LATEST_EPOCH = 253402300799


class SbomError(Exception):
    """A fact, tool or record that cannot be described truthfully: the build stops."""


def read_module(path: Path) -> tuple[dict[str, str], list[str]]:
    """The facts a module recorded (name -> value) and the libraries it loads (DT_NEEDED)."""
    try:
        with path.open("rb") as stream:
            elf = ELFFile(stream)
            section = elf.get_section_by_name(FACT_SECTION)
            if section is None:
                raise SbomError(f"{path}: no {FACT_SECTION} section (engine/common/sbom_facts.h)")
            facts = _facts(path, section.data())
            dynamic = elf.get_section_by_name(".dynamic")
            needed = [tag.needed for tag in dynamic.iter_tags("DT_NEEDED")] if dynamic else []
    except OSError as error:
        raise SbomError(
            f"{path}: expected a built module; cannot read it ({error.strerror})"
        ) from None
    except (ELFError, ConstructError) as error:
        raise SbomError(
            f"{path}: expected an ELF shared object; got a file pyelftools cannot read ({error})"
        ) from None
    return facts, needed


def _facts(path: Path, data: bytes) -> dict[str, str]:
    """The `name=value` entries of the fact section, each UTF-8 and each name given once."""
    facts: dict[str, str] = {}
    for entry in filter(None, data.split(b"\0")):
        try:
            text = entry.decode()
        except UnicodeDecodeError:
            raise SbomError(
                f"{path}: {FACT_SECTION}: expected UTF-8 name=value facts; got {entry!r}"
            ) from None
        name, separator, value = text.partition("=")
        if not separator or facts.get(name, value) != value:
            raise SbomError(f"{path}: {FACT_SECTION}: conflicting or malformed fact {entry!r}")
        facts[name] = value
    return facts


def _linkage(needed: list[str], *sonames: str) -> str:
    return "dynamic" if any(n.startswith(sonames) for n in needed) else "static"


def _number(facts: dict[str, str], name: str, expected: str) -> int:
    """The fact `name` as a decimal number; SbomError naming the fact otherwise."""
    value = facts[name].partition(" ")[2] if name == "cxx_runtime" else facts[name]
    if re.fullmatch(r"[0-9]+", value) is None:
        raise SbomError(f"{FACT_SECTION}: {name}: expected {expected}; got {facts[name]!r}")
    return int(value)


def _llvm_version(facts: dict[str, str]) -> str:
    number = _number(facts, "cxx_runtime", "'libc++ ' and _LIBCPP_VERSION's MMmmpp digits")
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


def _cuda_version(facts: dict[str, str]) -> str:
    number = _number(facts, "cuda_runtime", "CUDART_VERSION's MMMmm digits")
    return f"{number // 1000}.{number % 1000 // 10}"


def linked_components(facts: dict[str, str], needed: list[str]) -> list[Component]:
    """The third-party code one module carries, named by its facts."""
    found: list[Component] = []
    runtime, _, runtime_version = facts.get("cxx_runtime", "").partition(" ")
    if runtime not in ("", "libc++", "libstdc++"):
        raise SbomError(
            f"{FACT_SECTION}: cxx_runtime: expected 'libc++ VERSION' or 'libstdc++ "
            f"VERSION'; got {facts['cxx_runtime']!r}"
        )
    if runtime == "libc++":
        version = _llvm_version(facts)
        # zig links libc++, libc++abi and libunwind of one LLVM release; libc++'s shared library
        # loads the other two.
        for name, subpath, soname in (
            ("libc++", "libcxx", "libc++.so"),
            ("libc++abi", "libcxxabi", "libc++abi.so"),
            ("libunwind", "libunwind", "libunwind.so"),
        ):
            found.append(
                _library(
                    name,
                    version,
                    _linkage(needed, "libc++.so", soname),
                    license_expression=LLVM_LICENSE,
                    purl=PackageURL(
                        "github", "llvm", "llvm-project", f"llvmorg-{version}", subpath=subpath
                    ),
                    cpe=f"cpe:2.3:a:llvm:llvm:{version}:*:*:*:*:*:*:*",
                    supplier="LLVM Project",
                )
            )
    elif runtime == "libstdc++":
        _number(facts, "cxx_runtime", "'libstdc++ ' and _GLIBCXX_RELEASE's digits")
        found.append(
            _library(
                "libstdc++",
                runtime_version,
                _linkage(needed, "libstdc++.so"),
                license_expression="GPL-3.0-only WITH GCC-exception-3.1",
                cpe=f"cpe:2.3:a:gnu:gcc:{runtime_version}:*:*:*:*:*:*:*",
                supplier="GNU Project",
            )
        )
    if "cuda_runtime" in facts:
        version = _cuda_version(facts)
        found.append(
            _library(
                "cudart",
                version,
                _linkage(needed, "libcudart.so"),
                supplier="NVIDIA",
                license_name="NVIDIA CUDA Toolkit End User License Agreement",
                cpe=f"cpe:2.3:a:nvidia:cuda_toolkit:{version}:*:*:*:*:*:*:*",
            )
        )
    if nanobind := facts.get("nanobind"):
        found.append(
            _library(
                "nanobind",
                nanobind,
                "static",
                license_expression="BSD-3-Clause",
                purl=PackageURL("pypi", None, "nanobind", nanobind),
                supplier="Wenzel Jakob",
            )
        )
    if robin_map := facts.get("robin_map"):
        found.append(
            _library(
                "robin-map",
                robin_map,
                "static",
                license_expression="MIT",
                purl=PackageURL("github", "tessil", "robin-map", f"v{robin_map}"),
                supplier="Tessil",
            )
        )
    return found


def _library(
    name: str,
    version: str,
    linkage: str,
    *,
    supplier: str,
    license_expression: str | None = None,
    license_name: str | None = None,
    purl: PackageURL | None = None,
    cpe: str | None = None,
) -> Component:
    licenses = (
        [LicenseExpression(license_expression)]
        if license_expression
        else [DisjunctiveLicense(name=license_name)]
    )
    # One component per library, version and linkage: a copy linked into a module (static) and
    # a shared library the module loads at run time (dynamic, DT_NEEDED) are different artifacts,
    # shipped differently and patched differently. CycloneDX gives each component one set of
    # properties, so two modules that link the same library differently must not share a
    # component whose activekv:linkage would be true for only one of them: each linkage has its
    # own component and bom-ref, and each module depends on the one it really uses.
    return Component(
        name=name,
        version=version,
        type=ComponentType.LIBRARY,
        bom_ref=f"{name}@{version}:{linkage}",
        supplier=OrganizationalEntity(name=supplier),
        licenses=licenses,
        purl=purl,
        cpe=cpe,
        properties=[Property(name="activekv:linkage", value=linkage)],
    )


def _sha256(flag: str, path: str) -> str:
    try:
        return hashlib.sha256(Path(path).resolve().read_bytes()).hexdigest()
    except OSError as error:
        raise SbomError(
            f"{flag} {path}: expected the binary CMake ran; cannot read it ({error.strerror})"
        ) from None


def tool_version(given: str, text: str) -> str:
    """The version number in what CMake, a record or a tool says of the tool `given` names: a
    plain version ("13.0.88"), CMake's "<id> <version>" ("Clang 19.1.0"), or the first line of
    its `--version` ("g++ (Debian 12.2.0-14) 12.2.0", "clang version 19.1.7 (...)")."""
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    said = re.search(r"\bversion (\S+)", line)
    candidate = said.group(1) if said else (line.split() or [""])[-1]
    if TOOL_VERSION.fullmatch(candidate) is None:
        raise SbomError(
            f"{given}: expected a version major.minor.patch, or a --version line that ends in "
            f"one; got {text!r}"
        )
    return candidate


def _tool(
    name: str, version: str | None, sha256: str | None, purl: PackageURL | None = None
) -> Component:
    hashes = [HashType(alg=HashAlgorithm.SHA_256, content=sha256)] if sha256 else []
    return Component(
        name=name,
        version=version or None,
        type=ComponentType.APPLICATION,
        bom_ref=f"tool:{name}",
        hashes=hashes,
        purl=purl,
    )


def _recorded(given: Mapping[str, object]) -> dict[str, str]:
    """The record's entries the SBOM takes, each there and each a string."""
    missing = [key for key in RECORDED if key not in given]
    if missing:
        raise SbomError(f"toolchain record: expected the keys {missing}; the record lacks them")
    record: dict[str, str] = {}
    for key in RECORDED:
        value = given[key]
        if not isinstance(value, str):
            raise SbomError(f"toolchain record: {key}: expected a string; got {value!r}")
        record[key] = value
    return record


def recorded_tools(
    given: Mapping[str, object], ran: argparse.Namespace, facts: dict[str, str]
) -> list[Component]:
    """The pipeline's toolchain record, after checking it names the tools CMake ran."""
    record = _recorded(given)
    checks = [
        ("cmake", record.get("cmake"), ran.cmake_version),
        ("cmake_sha256", record.get("cmake_sha256"), _sha256("--cmake", ran.cmake)),
        ("nvcc", record.get("nvcc"), ".".join(ran.nvcc_version.split(".")[:2])),
        ("nvcc_version", record.get("nvcc_version"), ran.nvcc_version),
        ("nvcc_sha256", record.get("nvcc_sha256"), _sha256("--nvcc", ran.nvcc)),
        ("nanobind", record.get("nanobind"), facts.get("nanobind")),
        ("scikit-build-core", record.get("scikit-build-core"), ran.scikit_build_core),
    ]
    if ran.cuda_host_compiler:
        checks.append(
            (
                "cuda_host_compiler_sha256",
                record.get("cuda_host_compiler_sha256"),
                _sha256("--cuda-host-compiler", ran.cuda_host_compiler),
            )
        )
    for key, recorded, actual in checks:
        if recorded != actual:
            raise SbomError(
                f"toolchain record: {key}: expected what this build ran, {actual!r}; "
                f"got {recorded!r}"
            )
    version = {
        key: tool_version(f"toolchain record: {key}", record[key])
        for key in ("nvcc_version", *_TOOLS)
        if key != "nvcc"  # its release (major.minor); nvcc_version is the exact version
    }
    pypi = {
        name: PackageURL("pypi", None, name, version[name])
        for name in ("cmake", "nanobind", "scikit-build-core")
    }
    return [
        _tool(
            "zig",
            version["zig"],
            record["zig_sha256"],
            PackageURL("pypi", None, "ziglang", version["zig"]),
        ),
        _tool("nvcc", version["nvcc_version"], record["nvcc_sha256"]),
        _tool(
            "cuda-host-compiler",
            version["cuda_host_compiler"],
            record["cuda_host_compiler_sha256"],
        ),
        _tool("cmake", version["cmake"], record["cmake_sha256"], pypi["cmake"]),
        _tool("nanobind", version["nanobind"], record["nanobind_sha256"], pypi["nanobind"]),
        _tool(
            "scikit-build-core",
            version["scikit-build-core"],
            record["scikit-build-core_sha256"],
            pypi["scikit-build-core"],
        ),
    ]


def observed_tools(ran: argparse.Namespace, facts: dict[str, str]) -> list[Component]:
    """Without a record: the tools CMake ran, hashed where they are binaries it can see."""
    if "nanobind" not in facts:
        raise SbomError(
            f"--module: expected a module that records the nanobind fact in "
            f"{FACT_SECTION} (bindings/build_facts.h); none does"
        )
    tools = [
        _tool(
            "cxx-compiler",
            tool_version("--cxx-compiler-version", ran.cxx_compiler_version),
            _sha256("--cxx-compiler", ran.cxx_compiler),
        ),
        _tool(
            "nvcc", tool_version("--nvcc-version", ran.nvcc_version), _sha256("--nvcc", ran.nvcc)
        ),
        _tool(
            "cmake",
            tool_version("--cmake-version", ran.cmake_version),
            _sha256("--cmake", ran.cmake),
        ),
        _tool("nanobind", facts["nanobind"], None),
        _tool(
            "scikit-build-core", tool_version("--scikit-build-core", ran.scikit_build_core), None
        ),
    ]
    if ran.cuda_host_compiler:
        tools.insert(
            2,
            _tool(
                "cuda-host-compiler", None, _sha256("--cuda-host-compiler", ran.cuda_host_compiler)
            ),
        )
    return tools


def _module_spec(spec: str) -> tuple[str, str, Path]:
    """`IMPORT_NAME=PATH_IN_WHEEL=INSTALLED_FILE`, each part given."""
    parts = spec.split("=", 2)
    if len(parts) != 3 or not all(parts):
        raise SbomError(f"--module {spec!r}: expected IMPORT_NAME=PATH_IN_WHEEL=INSTALLED_FILE")
    name, wheel_path, built = parts
    return name, wheel_path, Path(built)


def _module_parts(built: Path) -> tuple[dict[str, str], list[Component]]:
    """A module's facts and the components it links in; errors name the module's file."""
    facts, needed = read_module(built)
    try:
        return facts, linked_components(facts, needed)
    except SbomError as error:
        raise SbomError(f"{built}: {error}") from None


def _merge_facts(all_facts: dict[str, str], facts: dict[str, str], built: Path) -> None:
    """The fact the tools are checked by (nanobind), which every module must agree on."""
    if (
        "nanobind" in facts
        and all_facts.setdefault("nanobind", facts["nanobind"]) != facts["nanobind"]
    ):
        raise SbomError(
            f"{built}: {FACT_SECTION}: nanobind: expected {all_facts['nanobind']!r}, "
            f"as the modules before it record; got {facts['nanobind']!r}"
        )


def module_sha256(path: Path) -> str:
    """The SHA-256 of the module as the wheel will hold it (read_module has read it)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as error:
        raise SbomError(
            f"{path}: expected a built module; cannot read it ({error.strerror})"
        ) from None


def project_license(pyproject: Path) -> str:
    """pyproject.toml's `project.license`, the SPDX expression (PEP 639) METADATA gives as
    License-Expression, spelled as scikit-build-core spells it there (canonical)."""
    try:
        declared = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except OSError as error:
        raise SbomError(
            f"--pyproject {pyproject}: expected the project's pyproject.toml; cannot read it "
            f"({error.strerror})"
        ) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise SbomError(f"--pyproject {pyproject}: expected TOML; got {error}") from None
    expression = declared.get("project", {}).get("license")
    if not isinstance(expression, str) or not expression.strip():
        raise SbomError(
            f"{pyproject}: project.license: expected an SPDX licence expression (PEP 639); "
            f"got {expression!r}"
        )
    try:
        from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression
    except ImportError:  # packaging before 24.2 cannot spell it; scikit-build-core neither
        return expression
    try:
        return str(canonicalize_license_expression(expression))
    except InvalidLicenseExpression as error:
        raise SbomError(
            f"{pyproject}: project.license: expected an SPDX licence expression; got "
            f"{expression!r} ({error})"
        ) from None


def read_record(argument: str) -> dict[str, object] | None:
    """The `--toolchain-record` JSON object; None when the argument is empty (no record)."""
    if not argument:
        return None
    try:
        record = json.loads(Path(argument).read_text())
    except OSError as error:
        raise SbomError(
            f"--toolchain-record {argument}: expected the pipeline's toolchain "
            f"record; cannot read it ({error.strerror})"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SbomError(
            f"--toolchain-record {argument}: expected a JSON object; got a file "
            f"that is not JSON ({error})"
        ) from None
    if not isinstance(record, dict):
        raise SbomError(
            f"--toolchain-record {argument}: expected a JSON object; got {type(record).__name__}"
        )
    return record


def source_date(environ: Mapping[str, str]) -> datetime | None:
    """SOURCE_DATE_EPOCH as a UTC time; None when unset, SbomError when it is not plain seconds
    a timestamp can hold (reproducible-builds.org: a malformed value must fail the build)."""
    value = environ.get("SOURCE_DATE_EPOCH")
    if value is None:
        return None
    if re.fullmatch(r"[0-9]+", value) is None or int(value) > LATEST_EPOCH:
        raise SbomError(
            f"SOURCE_DATE_EPOCH: expected whole seconds since 1970, 0 to "
            f"{LATEST_EPOCH}; got {value!r}"
        )
    return datetime.fromtimestamp(int(value), tz=timezone.utc)


def build_sbom(arguments: argparse.Namespace) -> str:
    modules: list[Component] = []
    linked: dict[str, Component] = {}
    uses: dict[str, list[Component]] = {}
    all_facts: dict[str, str] = {}
    for spec in arguments.module:
        name, wheel_path, built = _module_spec(spec)
        if name in uses:
            raise SbomError(f"--module {spec!r}: expected each module once; {name} is given twice")
        facts, parts = _module_parts(built)
        _merge_facts(all_facts, facts, built)
        for part in parts:
            linked.setdefault(str(part.bom_ref), part)
        module = Component(
            name=name,
            version=arguments.version,
            type=ComponentType.LIBRARY,
            bom_ref=name,
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=module_sha256(built))],
            properties=[
                Property(name="activekv:file", value=wheel_path),
                Property(
                    name="activekv:cuda_architectures", value=facts.get("cuda_architectures", "")
                ),
            ],
        )
        modules.append(module)
        uses[name] = [linked[str(part.bom_ref)] for part in parts]

    record = read_record(arguments.toolchain_record)
    tools = (
        recorded_tools(record, arguments, all_facts)
        if record is not None
        else observed_tools(arguments, all_facts)
    )
    tools.append(this_component())

    package = Component(
        name=arguments.name,
        version=arguments.version,
        type=ComponentType.LIBRARY,
        bom_ref=f"pkg:pypi/{arguments.name}@{arguments.version}",
        purl=PackageURL("pypi", None, arguments.name, arguments.version),
        licenses=[LicenseExpression(project_license(arguments.pyproject))],
    )
    metadata = BomMetaData(component=package, tools=ToolRepository(components=tools))
    metadata.timestamp = source_date(os.environ)
    bom = Bom(components=[*modules, *linked.values()], metadata=metadata)
    for module in modules:
        bom.register_dependency(package, [module])
        bom.register_dependency(module, uses[module.name])
    # A serial number of the content: the same inputs give the same document.
    bom.serial_number = uuid.UUID(int=0)
    draft = JsonV1Dot6(bom).output_as_string(indent=2)
    bom.serial_number = uuid.uuid5(uuid.NAMESPACE_URL, hashlib.sha256(draft.encode()).hexdigest())
    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


def write_file(out: Path, text: str) -> None:
    """`text` at `out` whole or not at all: through a temporary file beside it, renamed into
    place; the temporary file is gone whatever fails."""
    if out.is_dir():
        raise SbomError(f"--out {out}: expected a file to write the SBOM to; it is a folder")
    partial: Path | None = None
    try:
        descriptor, name = tempfile.mkstemp(
            dir=out.parent, prefix=f".{out.name}.", suffix=".partial"
        )
        partial = Path(name)
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
        partial.chmod(0o644)
        partial.replace(out)
    except OSError as error:
        raise SbomError(f"--out {out}: cannot write the SBOM ({error.strerror or error})") from None
    finally:
        if partial is not None:
            partial.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument(
        "--module",
        action="append",
        required=True,
        help="IMPORT_NAME=PATH_IN_WHEEL=INSTALLED_FILE",
    )
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    parser.add_argument("--toolchain-record", default="")
    parser.add_argument("--cmake", required=True)
    parser.add_argument("--cmake-version", required=True)
    parser.add_argument("--nvcc", required=True)
    parser.add_argument("--nvcc-version", required=True)
    parser.add_argument("--cxx-compiler", required=True)
    parser.add_argument("--cxx-compiler-version", required=True)
    parser.add_argument("--cuda-host-compiler", default="")
    parser.add_argument("--scikit-build-core", required=True)
    arguments = parser.parse_args()
    try:
        write_file(arguments.out, build_sbom(arguments))
    except SbomError as error:
        print(f"write_sbom.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
