"""`python -m release cpp-tests`: the C++ tests, built by the host compiler and run by ctest.

The engine libraries are compiled here by the host g++ (not zig): the tests exercise the C++
itself, and sanitizer runtimes come with the host compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from release.builder.toolchain import resolve_host_toolchain
from release.errors import BuildError
from release.manifest import Manifest

SANITIZERS = {"asan-ubsan": "address,undefined", "tsan": "thread"}


def host_configure(
    manifest: Manifest,
    *,
    source_dir: Path,
    cache_dir: Path,
    build_dir: Path,
    build_type: str,
    options: tuple[str, ...],
    flags: str | None = None,
) -> dict[str, str]:
    """Configures `build_dir` for the host g++ and nvcc (ccache when present); the environment
    to build and run in."""
    toolchain = resolve_host_toolchain(manifest, cache_dir)
    configure = [
        "cmake", "-S", str(source_dir), "-B", str(build_dir), "-G", "Ninja",
        *options, f"-DCMAKE_BUILD_TYPE={build_type}",
        *(f"-D{key}={value}" for key, value in toolchain.cmake_defines().items()),
        f"-DACTIVEKV_CUDA_ARCHITECTURES={';'.join(manifest.build.cuda.architectures)}",
    ]  # fmt: skip
    if flags is not None:
        configure += [f"-DCMAKE_CXX_FLAGS={flags}", f"-DCMAKE_EXE_LINKER_FLAGS={flags}"]
    env = {**os.environ, **toolchain.environment()}
    _run(configure, env)
    return env


def host_build(build_dir: Path, env: dict[str, str], *targets: str) -> None:
    target_args = [arg for target in targets for arg in ("--target", target)]
    _run(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2), *target_args], env)


def _run(command: list[str], env: dict[str, str]) -> None:
    if subprocess.run(command, env=env).returncode != 0:
        raise BuildError(f"`{' '.join(command[:3])} …` failed; see the output above")


def run_cpp_tests(
    manifest: Manifest, *, source_dir: Path, cache_dir: Path, sanitizer: str | None = None
) -> int:
    """Configures, builds and runs the C++ tests; returns ctest's exit status."""
    if sanitizer is not None and sanitizer not in SANITIZERS:
        raise BuildError(f"--sanitizer: expected one of {sorted(SANITIZERS)}; got {sanitizer!r}")
    name = "ctest" if sanitizer is None else f"ctest-{sanitizer}"
    build_dir = source_dir / "build" / name
    flags = None
    if sanitizer is not None:
        flags = f"-fsanitize={SANITIZERS[sanitizer]} -fno-omit-frame-pointer"
    env = host_configure(
        manifest, source_dir=source_dir, cache_dir=cache_dir, build_dir=build_dir,
        build_type="Debug", options=("-DACTIVEKV_BUILD_TESTS=ON",), flags=flags,
    )  # fmt: skip
    host_build(build_dir, env)
    if shutil.which("ctest") is None:
        raise BuildError("ctest: not on PATH; install the `build` dependency group (cmake)")
    return subprocess.run(
        ["ctest", "--test-dir", str(build_dir), "--output-on-failure"], env=env
    ).returncode
