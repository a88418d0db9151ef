"""The toolchain record that goes into the signed provenance: version and sha256 of the zig
binary, nvcc, the CUDA host compiler (g++), cmake, and the scikit-build-core and nanobind
distributions, computed from the real tools of this machine."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from release.builder.toolchain import (
    CUDA_FILES,
    RECORDED_BUILD_REQUIREMENTS,
    resolve_toolchain,
    toolchain_record,
)
from release.errors import BuildError
from release.manifest import load_manifest
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST
from release.util.pins import pyproject

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("zig", "nvcc", "cuda_host_compiler", "cmake")


@pytest.fixture(scope="module")
def toolchain():
    manifest = load_manifest(DEFAULT_MANIFEST)
    nvcc_present = Path("/usr/local/cuda/bin/nvcc").is_file() or shutil.which("nvcc")
    if not nvcc_present:
        pytest.skip("no CUDA compiler here (the build installs one; not repeated in this test)")
    # the checkout's cache: the scikit-build-core and nanobind files are fetched once
    cache = Path(os.environ.get("ACTIVEKV_CACHE_DIR") or REPO / ".activekv" / "cache")
    return resolve_toolchain(manifest, cache)


def _build_path() -> str:
    """The PATH a build runs with: this interpreter's tools first (release/builder/wheels.py)."""
    return str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture(scope="module")
def record(toolchain) -> dict[str, str]:
    return toolchain_record(toolchain, _build_path())


def test_every_tool_has_a_version_path_and_the_sha256_of_its_bytes(record, toolchain) -> None:
    for tool in TOOLS:
        assert record[tool], tool
        assert record[f"{tool}_sha256"] == sha256_file(Path(record[f"{tool}_path"])), tool
    assert record["zig_path"] == str(toolchain.zig)
    assert (
        record["zig"]
        == subprocess.run(
            [str(toolchain.zig), "version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    assert record["nvcc"] == "13.0"  # what cmake/write_sbom.py checks
    assert record["nvcc_version"].startswith("13.0.")  # the full version, V13.0.88 -> 13.0.88
    assert record["cmake"] == pyproject()["build-system"]["requires"][2].split("==")[1]
    host = Path(record["cuda_host_compiler_path"])
    assert host == toolchain.cuda_host_compiler.resolve() and not host.is_symlink()


def test_build_requirements_are_their_pinned_distribution_files(record) -> None:
    pins = dict(r.split("==") for r in pyproject()["build-system"]["requires"])
    for name in RECORDED_BUILD_REQUIREMENTS:
        assert record[name] == pins[name]
        assert record[f"{name}_file"].startswith(name.replace("-", "_") + f"-{pins[name]}-")
        assert len(record[f"{name}_sha256"]) == 64


def test_a_different_compiler_binary_gives_a_different_digest(
    record, toolchain, tmp_path: Path
) -> None:
    """Negative control: the digest is of the binary used, not a constant or a version."""
    zig = tmp_path / "zig"
    shutil.copy2(toolchain.zig, zig)
    with zig.open("ab") as stream:
        stream.write(b"\0")
    changed = toolchain_record(dataclasses.replace(toolchain, zig=zig), _build_path())
    assert changed["zig"] == record["zig"]  # same version: the hash is what tells them apart
    assert changed["zig_sha256"] != record["zig_sha256"]
    assert changed["zig_sha256"] == sha256_file(zig)


def test_no_cmake_on_the_build_path_is_an_error(toolchain, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"no cmake on the build's PATH"):
        toolchain_record(toolchain, str(tmp_path))


def test_the_cuda_files_linked_or_run_are_recorded_by_digest(record, toolchain) -> None:
    """Negative control: only the nvcc driver was hashed, so a new libcudart_static.a (linked
    into every module) kept the record and the wheel cache's key."""
    for name in CUDA_FILES:
        path = Path(record[f"{name}_path"])
        assert path.is_file() and path.is_relative_to(toolchain.cuda_root.resolve()), name
        assert record[f"{name}_sha256"] == sha256_file(path), name
    assert Path(record["cudart_static_path"]).name == "libcudart_static.a"


def test_a_different_cudart_static_gives_a_different_record(
    record, toolchain, tmp_path: Path
) -> None:
    root = tmp_path / "cuda"
    for name in CUDA_FILES:
        source = Path(record[f"{name}_path"])
        copy = root / CUDA_FILES[name][0]
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.symlink_to(source)
    changed_lib = root / CUDA_FILES["cudart_static"][0]
    changed_lib.unlink()
    shutil.copy2(record["cudart_static_path"], changed_lib)
    with changed_lib.open("ab") as stream:
        stream.write(b"\0")
    changed = toolchain_record(dataclasses.replace(toolchain, cuda_root=root), _build_path())
    assert changed["cudart_static_sha256"] != record["cudart_static_sha256"]
    assert changed["cicc_sha256"] == record["cicc_sha256"]
