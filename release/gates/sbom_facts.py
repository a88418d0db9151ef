"""What a native module says it links in: the `name=value` facts its code recorded in the ELF
section `.activekv_sbom` (engine/common/sbom_facts.h, bindings/build_facts.h), read here from the
module's bytes independently of cmake/write_sbom.py, the components (name -> version) they
imply, and how each is linked (its `DT_NEEDED` entries). The SBOM gate (release/gates/sbom.py)
judges a wheel's SBOM against them."""

from __future__ import annotations

import io
import re
from pathlib import PurePosixPath

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from release.util.elf import ElfReadError, dt_needed

FACT_SECTION = ".activekv_sbom"
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
# Each fact a module may record, the form of its value, and that form in words.
FACT_FORMS: dict[str, tuple[re.Pattern[str], str]] = {
    "cxx_runtime": (
        re.compile(r"libc\+\+ [0-9]+|libstdc\+\+ [0-9]+"),
        "'libc++ <_LIBCPP_VERSION>' or 'libstdc++ <_GLIBCXX_RELEASE>' (decimal digits)",
    ),
    "cuda_runtime": (re.compile(r"[0-9]+"), "<CUDART_VERSION> (decimal digits)"),
    "cuda_architectures": (re.compile(r"\S+"), "the CUDA architectures, without spaces"),
    "nanobind": (_VERSION, "<major>.<minor>.<patch>"),
    "robin_map": (_VERSION, "<major>.<minor>.<patch>"),
}
# bindings/build_facts.h, compiled into every module, records these.
REQUIRED_FACTS = ("cxx_runtime", "nanobind", "robin_map")
# The shared libraries that carry each component when a module does not link it in (libc++'s
# own library loads libc++abi and libunwind). nanobind and robin-map are header code, always
# compiled in.
_SHARED_LIBRARIES = {
    "libc++": {"libc++"},
    "libc++abi": {"libc++", "libc++abi"},
    "libunwind": {"libc++", "libunwind"},
    "libstdc++": {"libstdc++"},
    "cudart": {"libcudart"},
}
# What auditwheel appends to a library it vendors: "libcudart-1a2b3c4d.so.13".
_VENDORED_SUFFIX = re.compile(r"-[0-9a-fA-F]+$")


class FactError(ValueError):
    """A module's `.activekv_sbom` facts cannot be read one way only."""


def module_facts(data: bytes) -> dict[str, str]:
    """The `name=value` facts a native module recorded; empty when it recorded none.

    Raises FactError for an entry that is not UTF-8 `name=value`, a fact of unknown name or
    form, a fact recorded twice with two values, or a module without the facts every one has."""
    try:
        section = ELFFile(io.BytesIO(data)).get_section_by_name(FACT_SECTION)
    except ELFError:
        return {}
    if section is None:
        return {}
    facts: dict[str, str] = {}
    for entry in section.data().split(b"\0"):
        if entry:
            name, value = _fact(entry)
            if facts.setdefault(name, value) != value:
                raise FactError(f"{name}: expected one value; got {facts[name]!r} and {value!r}")
    if missing := [name for name in REQUIRED_FACTS if name not in facts]:
        raise FactError(f"expected the facts {missing} (bindings/build_facts.h); missing")
    return facts


def module_needed(data: bytes) -> list[str]:
    """The shared libraries a native module names in its DT_NEEDED entries, read as the loader
    reads them (the PT_DYNAMIC segment, not the section headers); none when it is not ELF or
    has no dynamic segment. FactError when the segment cannot be read."""
    try:
        elf = ELFFile(io.BytesIO(data))
    except ELFError:
        return []
    try:
        return dt_needed(elf)
    except ElfReadError as error:
        raise FactError(str(error)) from None


def loaded_libraries(needed: list[str]) -> set[str]:
    """The libraries DT_NEEDED names, without path, version or auditwheel's suffix:
    "libcudart" for "libcudart.so.13", "libcudart-1a2b3c4d.so.13" or "/x/libcudart.so"."""
    stems = (PurePosixPath(name).name.split(".so", 1)[0] for name in needed)
    return {_VENDORED_SUFFIX.sub("", stem) for stem in stems}


def expected_linkage(component: str, needed: list[str]) -> str:
    """ "dynamic" when a module's DT_NEEDED names a shared library that carries `component`,
    else "static" (the code is in the module)."""
    return "dynamic" if component in components_loaded(needed) else "static"


def components_loaded(needed: list[str]) -> set[str]:
    """The components a module loads at run time by its DT_NEEDED entries."""
    loaded = loaded_libraries(needed)
    return {component for component, names in _SHARED_LIBRARIES.items() if names & loaded}


def _fact(entry: bytes) -> tuple[str, str]:
    try:
        text = entry.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FactError(f"expected UTF-8 name=value; got {entry!r} ({error.reason})") from None
    name, separator, value = text.partition("=")
    if not separator:
        raise FactError(f"expected name=value; got {text!r}")
    if name not in FACT_FORMS:
        raise FactError(f"expected only the facts {sorted(FACT_FORMS)}; got {name!r}")
    pattern, form = FACT_FORMS[name]
    if not pattern.fullmatch(value):
        raise FactError(f"{name}: expected {form}; got {value!r}")
    return name, value


def expected_components(facts: dict[str, str]) -> dict[str, str]:
    """Component name -> version, for what the facts (of the forms FACT_FORMS says) say a
    module links in."""
    expected: dict[str, str] = {}
    runtime, _, number = facts.get("cxx_runtime", "").partition(" ")
    if runtime == "libc++":
        value = int(number)  # _LIBCPP_VERSION: MMmmpp
        version = f"{value // 10000}.{value // 100 % 100}.{value % 100}"
        expected.update(dict.fromkeys(("libc++", "libc++abi", "libunwind"), version))
    elif runtime == "libstdc++":
        expected["libstdc++"] = number
    if cuda := facts.get("cuda_runtime"):
        expected["cudart"] = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"  # CUDART_VERSION
    for fact, name in (("nanobind", "nanobind"), ("robin_map", "robin-map")):
        if fact in facts:
            expected[name] = facts[fact]
    return expected
