"""Post-link checks of native modules, read with pyelftools.

The modules link zig's libc++ statically. Objects compiled by nvcc use the host g++, whose
libstdc++ symbols stay undefined under libc++: the link succeeds and the import fails on a user's
machine. Any reference to libstdc++ (by symbol version, name mangling or DT_NEEDED) fails here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection
from elftools.elf.sections import SymbolTableSection

from release.util.elf import ElfReadError, dt_needed

# libstdc++ mangled names: std:: outside libc++'s inline namespace std::__1 (St), the standard
# abbreviations (Sa allocator, Sb basic_string, Ss string, Si istream, So ostream, Sd iostream:
# types of std:: itself, so never libc++'s), the C++ ABI runtime, and the global operators
# new/delete (which libc++abi defines inside the module when linked).
_LIBSTDCXX_SYMBOL = re.compile(
    r"^(_ZNS[abdiost](?!3__1)|_ZNKS[abdiost](?!3__1)|_ZS[abdiost](?!3__1)|"
    r"_ZT[ISV]S[abdiost](?!3__1)|"
    r"_ZTVN10__cxxabiv1|__cxa_|__gxx_personality_v0|_Zn[wa][mj]|_Zd[la]Pv)"
)
_LIBSTDCXX_VERSION = re.compile(r"^(GLIBCXX|CXXABI)_")
# glibc defines these C++ ABI helpers itself; an unversioned weak reference is not libstdc++.
_GLIBC_CXA = frozenset({"__cxa_atexit", "__cxa_finalize", "__cxa_thread_atexit_impl"})
_FOREIGN_RUNTIMES = re.compile(r"^(libstdc\+\+|libc\+\+|libc\+\+abi|libgcc_s)\.so")


@dataclass(frozen=True)
class Finding:
    module: str
    problem: str


def _version_names(elf: ELFFile) -> dict[int, str]:
    """Version index -> required version name (from .gnu.version_r)."""
    names: dict[int, str] = {}
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection):
            for _, auxiliaries in section.iter_versions():
                for aux in auxiliaries:
                    names[aux.entry.vna_other] = aux.name
    return names


def cxx_runtime_findings(stream: BinaryIO, module: str) -> list[Finding]:
    """Every libstdc++ reference left in one ELF shared object."""
    elf = ELFFile(stream)
    try:
        needed = dt_needed(elf)
    except ElfReadError as error:
        return [Finding(module, str(error))]
    findings = [
        Finding(module, f"needs {library} (expected the C++ runtime linked statically)")
        for library in needed
        if _FOREIGN_RUNTIMES.match(library)
    ]
    dynsym = elf.get_section_by_name(".dynsym")
    if not isinstance(dynsym, SymbolTableSection):
        return findings
    versions = _version_names(elf)
    versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
    for index, symbol in enumerate(dynsym.iter_symbols()):
        if symbol.entry.st_shndx != "SHN_UNDEF" or not symbol.name:
            continue
        version = ""
        if versym is not None:
            version = versions.get(versym.get_symbol(index).entry.ndx, "")
        if version.startswith("GLIBC_") or symbol.name in _GLIBC_CXA:
            continue  # glibc's own (__cxa_atexit, __cxa_finalize), not the C++ runtime
        if _LIBSTDCXX_VERSION.match(version) or _LIBSTDCXX_SYMBOL.match(symbol.name):
            suffix = f"@{version}" if version else ""
            findings.append(Finding(module, f"undefined libstdc++ symbol {symbol.name}{suffix}"))
    return findings


def check_shared_object(path: Path) -> list[Finding]:
    with path.open("rb") as stream:
        return cxx_runtime_findings(stream, path.name)
