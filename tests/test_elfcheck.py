"""The post-link libstdc++ check (release/builder/elfcheck.py, release/builder/wheels.py
check_wheel_objects).

Negative controls reproduce the real failure mode: objects compiled by the host g++ (as nvcc's
host compiler does) linked by zig under its static libc++, where libstdc++ symbols stay undefined
and only the import fails; and a shared object linked by g++ that needs libstdc++.so.6.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import run_tool, zig_binary

from release.builder.elfcheck import check_shared_object
from release.builder.wheels import check_wheel_objects

pytestmark = pytest.mark.integration  # compiles and links with g++ and zig

ZIG_TARGET = "x86_64-linux-gnu.2.28"

# std::string forces out-of-line libstdc++ (g++) or libc++ (zig) symbols.
CXX_SOURCE = """\
#include <string>
extern "C" int probe(const char* text) {
    std::string copy(text);
    copy += "!";
    return static_cast<int>(copy.size());
}
"""
C_PURE = "int probe(int x) { return 2 * x + 1; }\n"
C_WITH_LIBC = "#include <string.h>\nint probe(const char* s) { return (int)strlen(s); }\n"


@dataclass(frozen=True)
class Objects:
    gxx_under_zig: Path  # g++ -c objects, linked by zig c++ (libstdc++ symbols left undefined)
    gxx_linked: Path  # compiled and linked by g++ (DT_NEEDED libstdc++.so.6)
    zig_only: Path  # compiled and linked by zig c++ (static libc++)
    c_with_libc: Path  # C linked by gcc, needs libc: __cxa_finalize@GLIBC_2.2.5 (glibc's)
    c_without_libc: Path  # C linked by gcc, needs nothing: crtstuff's unversioned weak one


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> Objects:
    zig = zig_binary()
    gxx = shutil.which("g++")
    gcc = shutil.which("gcc")
    if zig is None:
        pytest.skip("zig is missing (install the pinned `ziglang` of the build dependency group)")
    if gxx is None or gcc is None:
        pytest.skip("the host g++/gcc is missing")
    root = tmp_path_factory.mktemp("elfcheck")
    cxx = root / "probe.cpp"
    cxx.write_text(CXX_SOURCE)
    c_pure = root / "pure.c"
    c_pure.write_text(C_PURE)
    c_libc = root / "libc.c"
    c_libc.write_text(C_WITH_LIBC)
    made = Objects(
        gxx_under_zig=root / "gxx_under_zig.so",
        gxx_linked=root / "gxx_linked.so",
        zig_only=root / "zig_only.so",
        c_with_libc=root / "c_with_libc.so",
        c_without_libc=root / "c_without_libc.so",
    )
    run_tool(gxx, "-c", "-fPIC", "-O1", cxx, "-o", root / "probe.o")
    run_tool(
        zig, "c++", "-target", ZIG_TARGET, "-shared", root / "probe.o", "-o", made.gxx_under_zig
    )
    run_tool(gxx, "-shared", "-fPIC", "-O1", cxx, "-o", made.gxx_linked)
    run_tool(zig, "c++", "-target", ZIG_TARGET, "-shared", "-fPIC", "-O1", cxx, "-o", made.zig_only)
    run_tool(gcc, "-shared", "-fPIC", "-O1", c_libc, "-o", made.c_with_libc)
    run_tool(gcc, "-shared", "-fPIC", "-O1", c_pure, "-o", made.c_without_libc)
    return made


def _undefined_by_nm(path: Path) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm is missing")
    text = subprocess.run(
        [nm, "-D", "--undefined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1].split("@")[0] for line in text.splitlines() if line.strip()}


def test_gxx_objects_linked_by_zig_leave_libstdcxx_symbols_undefined(objects: Objects) -> None:
    findings = check_shared_object(objects.gxx_under_zig)
    problems = [f.problem for f in findings]
    assert problems, "g++ objects under zig's libc++ must be caught"
    assert all(f.module == objects.gxx_under_zig.name for f in findings)
    assert all(p.startswith("undefined libstdc++ symbol ") for p in problems), problems
    named = {p.removeprefix("undefined libstdc++ symbol ").split("@")[0] for p in problems}
    # gcc's std::string (the __cxx11 ABI) and its throw helpers stay undefined under libc++.
    assert any(name.startswith("_ZNSt7__cxx1112basic_string") for name in named), named
    assert any(name.startswith("_ZSt20__throw_length_error") for name in named), named
    # Every reported symbol is one `nm -D --undefined-only` also lists (docs/toolchain.md).
    assert named <= _undefined_by_nm(objects.gxx_under_zig)


IOSTREAM_SOURCE = """\
#include <iostream>
extern "C" void probe(int value) { std::cout << value << std::endl; }
"""


def test_gxx_iostream_symbols_linked_without_libstdcxx_are_caught(tmp_path: Path) -> None:
    # std::ostream's members mangle with the So abbreviation (_ZNSolsEi), not St: linked by a
    # C linker they stay undefined and unversioned, and only the import would fail.
    gxx, gcc = shutil.which("g++"), shutil.which("gcc")
    if gxx is None or gcc is None:
        pytest.skip("the host g++/gcc is missing")
    source = tmp_path / "stream.cpp"
    source.write_text(IOSTREAM_SOURCE)
    run_tool(gxx, "-c", "-fPIC", "-O1", source, "-o", tmp_path / "stream.o")
    module = tmp_path / "stream.so"
    run_tool(gcc, "-shared", tmp_path / "stream.o", "-o", module)
    named = {
        f.problem.removeprefix("undefined libstdc++ symbol ").split("@")[0]
        for f in check_shared_object(module)
    }
    assert "_ZNSolsEi" in named, named  # std::ostream::operator<<(int)
    assert named <= _undefined_by_nm(module)
    zig = zig_binary()
    if zig is None:
        pytest.skip("zig is missing")
    under_libcxx = tmp_path / "stream_zig.so"
    run_tool(zig, "c++", "-target", ZIG_TARGET, "-shared", "-fPIC", "-O1", source,
             "-o", under_libcxx)  # fmt: skip
    assert check_shared_object(under_libcxx) == []


def test_gxx_linked_object_needs_libstdcxx(objects: Objects) -> None:
    problems = [f.problem for f in check_shared_object(objects.gxx_linked)]
    assert any(p.startswith("needs libstdc++.so.6") for p in problems), problems
    # With libstdc++ in the link its symbols carry GLIBCXX versions; those are named as well.
    assert any("@GLIBCXX_" in p for p in problems), problems


def test_cxx_object_compiled_and_linked_by_zig_has_no_findings(objects: Objects) -> None:
    assert check_shared_object(objects.zig_only) == []


def _nm_lines(path: Path) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm is missing")
    result = subprocess.run([nm, "-D", str(path)], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def test_versioned_glibc_cxa_finalize_is_not_libstdcxx(objects: Objects) -> None:
    assert any(
        line.endswith("__cxa_finalize@GLIBC_2.2.5") for line in _nm_lines(objects.c_with_libc)
    )
    assert check_shared_object(objects.c_with_libc) == []


def test_unversioned_glibc_cxa_finalize_is_not_libstdcxx(objects: Objects) -> None:
    # A gcc-linked object that needs no library keeps crtstuff's weak, unversioned
    # __cxa_finalize; glibc defines it (libstdc++ never does), so it is no C++ runtime reference.
    assert any(line.split()[-1] == "__cxa_finalize" for line in _nm_lines(objects.c_without_libc))
    assert check_shared_object(objects.c_without_libc) == []


def _zip_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_check_wheel_objects_names_the_wheel_and_member(objects: Objects, tmp_path: Path) -> None:
    bad = "activekv/_bad.cpython-311-x86_64-linux-gnu.so"
    good = "activekv/_good.cpython-311-x86_64-linux-gnu.so"
    wheel = _zip_wheel(
        tmp_path / "activekv-0.0.1-cp311-cp311-linux_x86_64.whl",
        {
            bad: objects.gxx_under_zig.read_bytes(),
            good: objects.zig_only.read_bytes(),
            "activekv/_bad.pyi": b"def probe(text: str) -> int: ...\n",
            "activekv-0.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\n",
        },
    )
    problems = check_wheel_objects(wheel)
    assert problems
    assert all(p.startswith(f"{wheel.name}: {bad}: undefined libstdc++ symbol ") for p in problems)
    assert not any(good in p for p in problems)


def test_check_wheel_objects_passes_a_zig_linked_wheel(objects: Objects, tmp_path: Path) -> None:
    wheel = _zip_wheel(
        tmp_path / "activekv-0.0.1-cp312-abi3-linux_x86_64.whl",
        {"activekv/_engine.abi3.so": objects.zig_only.read_bytes()},
    )
    assert check_wheel_objects(wheel) == []
