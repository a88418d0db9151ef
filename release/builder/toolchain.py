"""The hermetic toolchain: pinned zig as C/C++ compiler and linker, nvcc with the host C++ compiler.

zig targets the manifest's glibc, so the wheel links against no newer glibc symbols than the
declared manylinux policy allows, whatever the build machine's glibc is (docs/toolchain.md).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from release.errors import BuildError, GateError
from release.manifest import Manifest
from release.util.digests import sha256_file
from release.util.framework_cache import framework_wheel
from release.util.pins import dependency_group, pyproject

_NVCC_RELEASE = re.compile(r"release (\d+\.\d+)")
# The full version (V13.0.88): patch releases change the compiler, so the record keeps all of it.
_NVCC_VERSION = re.compile(r"\bV(\d+(?:\.\d+)+)")

# CUDA files besides nvcc that decide the wheels' bytes: the static runtime linked into every
# module, the device compilers nvcc drives, and the header that names the toolkit's version.
# Each entry: the record's key, then the paths (relative to the CUDA root) tried in order.
CUDA_FILES: dict[str, tuple[str, ...]] = {
    "cudart_static": (
        "lib64/libcudart_static.a",
        "lib/libcudart_static.a",
        "targets/x86_64-linux/lib/libcudart_static.a",
    ),
    "cicc": ("nvvm/bin/cicc",),
    "ptxas": ("bin/ptxas",),
    "cuda_h": ("include/cuda.h", "targets/x86_64-linux/include/cuda.h"),
}


def _ccache_environment(cache_dir: Path) -> dict[str, str]:
    return {
        "CCACHE_DIR": str(cache_dir / "ccache"),
        # Objects are shared across build directories and interpreters: hash content, not paths.
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": "content",
        "CCACHE_SLOPPINESS": "include_file_mtime,include_file_ctime,time_macros",
    }


@dataclass(frozen=True)
class HostToolchain:
    """nvcc and the host C++ compiler: what builds that run on this machine only (the C++ tests,
    the GPU staging bench) need; no zig, so a GPU runner without the build group can build them."""

    nvcc: Path
    cuda_root: Path
    cuda_host_compiler: Path
    ccache: Path | None
    cache_dir: Path

    def cmake_defines(self) -> dict[str, str]:
        """The host compiler for C++, nvcc with it for CUDA, ccache in front of both."""
        defines = {
            "CMAKE_CXX_COMPILER": str(self.cuda_host_compiler),
            "CMAKE_CUDA_COMPILER": str(self.nvcc),
            "CMAKE_CUDA_HOST_COMPILER": str(self.cuda_host_compiler),
            "CUDAToolkit_ROOT": str(self.cuda_root),
        }
        if self.ccache is not None:
            for lang in ("CXX", "CUDA"):
                defines[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = str(self.ccache)
        return defines

    def environment(self) -> dict[str, str]:
        """Variables the compilers read: ccache's cache lives in the cache directory."""
        return _ccache_environment(self.cache_dir)


@dataclass(frozen=True)
class Toolchain(HostToolchain):
    """The hermetic toolchain: the host one, with zig compiling and linking C and C++."""

    zig: Path
    cc: Path
    cxx: Path
    ar: Path
    ranlib: Path
    zig_target: str

    def cmake_defines(self) -> dict[str, str]:
        defines = super().cmake_defines()
        defines.update({
            "CMAKE_C_COMPILER": str(self.cc),
            "CMAKE_CXX_COMPILER": str(self.cxx),
            "CMAKE_AR": str(self.ar),
            "CMAKE_RANLIB": str(self.ranlib),
        })  # fmt: skip
        if self.ccache is not None:
            defines["CMAKE_C_COMPILER_LAUNCHER"] = str(self.ccache)
        return defines

    def environment(self) -> dict[str, str]:
        """Variables the compilers read: zig's and ccache's caches live in the cache directory."""
        return {
            "ZIG_GLOBAL_CACHE_DIR": str(self.cache_dir / "zig-global"),
            "ZIG_LOCAL_CACHE_DIR": str(self.cache_dir / "zig-local"),
            **super().environment(),
        }

    def identity(self) -> dict[str, str]:
        """Versions of every compiler, for the provenance and the summary."""
        nvcc = _output([str(self.nvcc), "--version"])
        return {
            "zig": _first_line([str(self.zig), "version"]),
            "zig_target": self.zig_target,
            # cmake/write_sbom.py checks "nvcc" against major.minor; the full version is apart.
            "nvcc": _line_of(nvcc, _NVCC_RELEASE),
            "nvcc_version": _line_of(nvcc, _NVCC_VERSION),
            "cuda_host_compiler": _first_line([str(self.cuda_host_compiler), "--version"]),
            "ccache": _first_line([str(self.ccache), "--version"]) if self.ccache else "not used",
        }


# Build requirements whose distribution files the provenance names (cmake is a binary: hashed).
RECORDED_BUILD_REQUIREMENTS = ("scikit-build-core", "nanobind")
_CMAKE_VERSION = re.compile(r"cmake version (\S+)")


def toolchain_record(toolchain: Toolchain, search_path: str) -> dict[str, str]:
    """:meth:`Toolchain.identity` plus, for the provenance, the version and sha256 of every tool
    that makes the wheels' bytes: the zig binary, nvcc, the CUDA host compiler (g++), cmake, and
    the distribution files of scikit-build-core and nanobind as pip resolves their pins.

    ``search_path`` is the PATH the build runs with (it decides which cmake answers). The build
    group and ``build-system.requires`` pin the same cmake, so the isolated build environment
    runs a binary of the same distribution file as the one recorded.
    """
    record = dict(toolchain.identity())
    record["zig_path"] = str(toolchain.zig)
    record["zig_sha256"] = sha256_file(toolchain.zig)
    nvcc = toolchain.nvcc.resolve()
    record["nvcc_path"] = str(nvcc)
    record["nvcc_sha256"] = sha256_file(nvcc)
    for name, path in cuda_files(toolchain.cuda_root).items():
        record[f"{name}_path"] = str(path)
        record[f"{name}_sha256"] = sha256_file(path)
    host = toolchain.cuda_host_compiler.resolve()
    record["cuda_host_compiler_path"] = str(host)
    record["cuda_host_compiler_sha256"] = sha256_file(host)
    cmake = _cmake_binary(search_path)
    record["cmake"] = _first_line([str(cmake), "--version"], pick=_CMAKE_VERSION)
    record["cmake_path"] = str(cmake)
    record["cmake_sha256"] = sha256_file(cmake)
    pins = _build_system_pins()
    for name in RECORDED_BUILD_REQUIREMENTS:
        version = pins.get(name)
        if version is None:
            raise BuildError(
                f"pyproject.toml: build-system.requires: expected an exact pin of {name} "
                "(name==version)"
            )
        distribution = _distribution_file(name, version, toolchain.cache_dir)
        record[name] = version
        record[f"{name}_file"] = distribution.name
        record[f"{name}_sha256"] = sha256_file(distribution)
    return record


def cuda_files(cuda_root: Path) -> dict[str, Path]:
    """The files of :data:`CUDA_FILES` under ``cuda_root``; BuildError names a missing one."""
    found: dict[str, Path] = {}
    for name, candidates in CUDA_FILES.items():
        paths = [cuda_root / c for c in candidates if (cuda_root / c).is_file()]
        if not paths:
            raise BuildError(
                f"toolchain: CUDA root {cuda_root}: expected {name} at one of {list(candidates)}"
            )
        found[name] = paths[0].resolve()
    return found


def _cmake_binary(search_path: str) -> Path:
    """The cmake binary the build runs; a pip-installed ``cmake`` script is followed to it."""
    found = shutil.which("cmake", path=search_path)
    if found is None:
        raise BuildError("toolchain: no cmake on the build's PATH (install the build group)")
    try:
        import cmake as cmake_distribution  # the pinned `cmake` of the build dependency group

        binary = Path(cmake_distribution.CMAKE_BIN_DIR) / "cmake"
        if Path(found).parent == Path(sys.executable).parent and binary.is_file():
            return binary  # the console script of that same distribution runs this binary
    except ImportError:
        pass
    return Path(found).resolve()


def _build_system_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for requirement in pyproject()["build-system"]["requires"]:
        name, separator, version = requirement.partition("==")
        if separator:
            pins[name.strip().lower()] = version.strip()
    return pins


def _distribution_file(name: str, version: str, cache_dir: Path) -> Path:
    """The file pip resolves for ``name==version`` (what the isolated build env installs),
    downloaded once into the cache (the framework cache's one download path)."""
    try:
        return framework_wheel(name, version, cache_dir)
    except GateError as error:
        raise BuildError(
            f"toolchain: cannot fetch {name}=={version} to record its digest: {error}"
        ) from None


def _output(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def _line_of(text: str, pick: re.Pattern[str] | None = None) -> str:
    """What `pick` finds in `text` (its group), else the first line."""
    if pick is not None and (match := pick.search(text)):
        return match.group(1)
    return text.strip().splitlines()[0]


def _first_line(command: list[str], pick: re.Pattern[str] | None = None) -> str:
    return _line_of(_output(command), pick)


def zig_target(manifest: Manifest) -> str:
    major, minor = manifest.build.glibc
    return f"x86_64-linux-gnu.{major}.{minor}"


def _write_wrapper(path: Path, argv: list[str], zig_sha256: str) -> Path:
    # CMake wants one executable per compiler, so `zig c++ -target …` is wrapped in a script.
    # ccache (CCACHE_COMPILERCHECK=content) hashes this text, not zig: naming zig's digest here
    # makes a new zig at the same path miss the objects the old one compiled.
    quoted = " ".join(f"'{arg}'" for arg in argv)
    text = f'#!/bin/sh\n# zig sha256 {zig_sha256}\nexec {quoted} "$@"\n'
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)
    return path


def find_zig() -> Path:
    """The zig binary of the pinned `ziglang` distribution installed in this environment."""
    try:
        import ziglang  # the pinned ziglang distribution of the build dependency group
    except ImportError as error:
        raise BuildError(
            "toolchain: the pinned `ziglang` is not installed in this environment "
            f"({sys.executable}); install the `build` dependency group of pyproject.toml"
        ) from error
    zig = Path(ziglang.__file__).parent / "zig"
    if not zig.is_file():
        raise BuildError(f"toolchain: ziglang has no zig binary at {zig}")
    return zig


def _cuda_major_minor(nvcc: Path) -> str:
    return _first_line([str(nvcc), "--version"], pick=_NVCC_RELEASE)


def _system_nvcc() -> Path | None:
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in filter(None, candidates):
        if (nvcc := Path(root) / "bin" / "nvcc").is_file():
            return nvcc
    found = shutil.which("nvcc")
    return Path(found) if found else None


PINS_STAMP = ".pins-sha256"  # in the install folder: the pins it was installed from


def _pins_digest(pins: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(pins)).encode()).hexdigest()


def _installed_pins(target: Path) -> str | None:
    stamp = target / PINS_STAMP
    return stamp.read_text().strip() if stamp.is_file() else None


def _install_cuda_wheels(target: Path) -> Path:
    """Installs the pinned NVIDIA compiler wheels into `target` unless it holds exactly the
    current pins (a stamp records them: changed pins reinstall); returns the CUDA root."""
    root = target / "nvidia" / "cu13"
    pins = dependency_group("cuda-compiler")
    digest = _pins_digest(pins)
    if _installed_pins(target) != digest or not (root / "bin" / "nvcc").is_file():
        print("toolchain: installing the pinned NVIDIA compiler wheels (no CUDA toolkit used)")
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(staging), *pins],
            check=True,
        )
        (staging / PINS_STAMP).write_text(digest + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.replace(target)
    # nvcc.profile searches lib64; FindCUDAToolkit wants the unversioned libcudart.so.
    lib64 = root / "lib64"
    if not lib64.exists():
        lib64.symlink_to("lib")
    unversioned = root / "lib" / "libcudart.so"
    if not unversioned.exists():
        versioned = sorted((root / "lib").glob("libcudart.so.*"))
        if not versioned:
            raise BuildError(f"toolchain: no libcudart.so.* under {root / 'lib'}")
        unversioned.symlink_to(versioned[0].name)
    return root


def find_host_compiler(manifest: Manifest) -> str:
    """The manifest's CUDA host compiler on PATH, else BuildError naming the key."""
    name = manifest.build.toolchain.cuda_host_compiler
    host = shutil.which(name)
    if host is None:
        raise BuildError(
            f"{manifest.path}: build.toolchain.cuda_host_compiler: expected a program on PATH; "
            f"{name!r} was not found"
        )
    return host


def resolve_host_toolchain(manifest: Manifest, cache_dir: Path) -> HostToolchain:
    """nvcc (the manifest's CUDA version; the pinned NVIDIA wheels where no toolkit is) and the
    manifest's host compiler, caching under cache_dir."""
    tool_dir = cache_dir / "toolchain"
    # ACTIVEKV_CUDA_COMPILER=wheels uses the pinned NVIDIA wheels even where a toolkit exists.
    choice = os.environ.get("ACTIVEKV_CUDA_COMPILER", "auto")
    if choice not in ("auto", "wheels"):
        raise BuildError(f"ACTIVEKV_CUDA_COMPILER: expected 'auto' or 'wheels'; got {choice!r}")
    nvcc = _system_nvcc() if choice == "auto" else None
    if nvcc is None:
        cuda_root = _install_cuda_wheels(tool_dir / "cuda-wheels")
        nvcc = cuda_root / "bin" / "nvcc"
    cuda_root = nvcc.resolve().parent.parent
    declared = manifest.build.cuda.version
    found = _cuda_major_minor(nvcc)
    if found != declared:
        raise BuildError(
            f"{manifest.path}: build.cuda.version: expected the CUDA compiler to be {declared}; "
            f"{nvcc} is {found}"
        )

    host = find_host_compiler(manifest)
    ccache = shutil.which("ccache")
    return HostToolchain(
        nvcc=nvcc,
        cuda_root=cuda_root,
        cuda_host_compiler=Path(host),
        ccache=Path(ccache) if ccache else None,
        cache_dir=cache_dir,
    )


def resolve_toolchain(manifest: Manifest, cache_dir: Path) -> Toolchain:
    """Finds or installs every compiler the manifest's toolchain needs, caching under cache_dir."""
    target = zig_target(manifest)
    wrapper_dir = cache_dir / "toolchain" / f"zig-{target}"
    wrapper_dir.mkdir(parents=True, exist_ok=True)
    zig = find_zig()
    zig_sha256 = sha256_file(zig)
    host = resolve_host_toolchain(manifest, cache_dir)
    return Toolchain(
        **{field.name: getattr(host, field.name) for field in fields(host)},
        zig=zig,
        # The names contain "clang" so ccache treats the wrappers as the clang they are.
        cc=_write_wrapper(
            wrapper_dir / "zig-clang", [str(zig), "cc", "-target", target], zig_sha256
        ),
        cxx=_write_wrapper(
            wrapper_dir / "zig-clang++", [str(zig), "c++", "-target", target], zig_sha256
        ),
        ar=_write_wrapper(wrapper_dir / "zig-ar", [str(zig), "ar"], zig_sha256),
        ranlib=_write_wrapper(wrapper_dir / "zig-ranlib", [str(zig), "ranlib"], zig_sha256),
        zig_target=target,
    )
