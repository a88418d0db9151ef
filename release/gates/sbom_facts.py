"""What a native module says it links in: the `name=value` facts its code recorded in the ELF
section `.activekv_sbom` (engine/common/sbom_facts.h, bindings/common.h), read here from the
module's bytes independently of cmake/write_sbom.py, the components (name -> version) they
imply, and how each is linked (its `DT_NEEDED` entries). The SBOM gate (release/gates/sbom.py)
judges a wheel's SBOM against them."""

from __future__ import annotations

import io
import re

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

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
# bindings/common.h, compiled into every module, records these.
REQUIRED_FACTS = ("cxx_runtime", "nanobind", "robin_map")
# The shared library each component is loaded from when a module does not link it in; zig links
# libc++, libc++abi and libunwind of one LLVM release, one way. nanobind and robin-map are
# header code, always compiled in.
_SHARED_LIBRARY = {
    "libc++": "libc++",
    "libc++abi": "libc++",
    "libunwind": "libc++",
    "libstdc++": "libstdc++",
    "cudart": "libcudart",
}
# A DT_NEEDED name's library: "libcudart.so.13", or as auditwheel renames what it vendors,
# "libcudart-1a2b3c4d.so.13".
_SONAME = re.compile(r"(?P<library>.+?)(?:-[0-9a-f]{8})?\.so(?:\.[0-9.]*)?")


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
        raise FactError(f"expected the facts {missing} (bindings/common.h); missing")
    return facts


def module_needed(data: bytes) -> list[str]:
    """The shared libraries a native module names in its DT_NEEDED entries (none when it is not
    ELF or has no dynamic section)."""
    try:
        dynamic = ELFFile(io.BytesIO(data)).get_section_by_name(".dynamic")
    except ELFError:
        return []
    if dynamic is None or not hasattr(dynamic, "iter_tags"):
        return []
    return [tag.needed for tag in dynamic.iter_tags("DT_NEEDED")]


def expected_linkage(component: str, needed: list[str]) -> str:
    """ "dynamic" when a module's DT_NEEDED names the shared library of `component`, else
    "static" (the code is in the module)."""
    loaded = {m.group("library") for name in needed if (m := _SONAME.fullmatch(name))}
    return "dynamic" if _SHARED_LIBRARY.get(component) in loaded else "static"


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
