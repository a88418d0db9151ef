"""The wheel cache's key and the toolchain's inputs (release/builder/wheels.py, toolchain.py): every
input that changes a wheel's bytes changes the key, checked on the key functions without a build.
Each test is a negative control for a stale-cache defect: it fails where the input was ignored."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from release.builder import toolchain as toolchain_module
from release.builder import wheels
from release.builder.toolchain import CUDA_FILES, PINS_STAMP, cuda_files
from release.builder.wheels import (
    _source_digest,
    build_environment_digest,
    toolchain_key,
)
from release.errors import BuildError
from release.util.paths import LICENSE_FILES, SOURCE_ROOTS
from release.util.pins import pyproject

BASE_ENV = {"PATH": "/usr/bin", "HOME": "/home/u", "SOURCE_DATE_EPOCH": "1700000000"}


# --- item 1: the build environment and the licence files ---


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CXXFLAGS", "-O0"),
        ("CFLAGS", "-O0"),
        ("LDFLAGS", "-Wl,--as-needed"),
        ("CUDAFLAGS", "-lineinfo"),
        ("NVCC_APPEND_FLAGS", "-G"),
        ("NVCC_PREPEND_FLAGS", "-O0"),
        ("CMAKE_ARGS", "-DFOO=1"),
        ("CMAKE_PREFIX_PATH", "/opt/x"),
        ("SKBUILD_CMAKE_DEFINE", "FOO=1"),
        ("TensorRT_ROOT", "/opt/tensorrt"),
        ("CUDA_HOME", "/opt/cuda"),
        ("CUDA_PATH", "/opt/cuda"),
    ],
)
def test_a_build_variable_changes_the_key(name: str, value: str) -> None:
    assert build_environment_digest({**BASE_ENV, name: value}) != build_environment_digest(BASE_ENV)


def test_a_changed_value_changes_the_key() -> None:
    one = build_environment_digest({**BASE_ENV, "CXXFLAGS": "-O2"})
    assert one != build_environment_digest({**BASE_ENV, "CXXFLAGS": "-O0"})


@pytest.mark.parametrize("name", ["HOME", "TERM", "PIP_CACHE_DIR", "CCACHE_DIR", "PWD"])
def test_a_variable_no_build_reads_leaves_the_key(name: str) -> None:
    assert build_environment_digest({**BASE_ENV, name: "x"}) == build_environment_digest(BASE_ENV)


def _builder(tmp_path: Path, env: dict[str, str]) -> Any:
    """A WheelBuilder with its fields set by hand: no toolchain is resolved, nothing is built."""
    builder = object.__new__(wheels.WheelBuilder)
    builder.source_dir = tmp_path / "src"
    builder.toolchain_key = "k" * 12
    builder.epoch = 1_700_000_000
    builder.manifest = type("M", (), {"build": type("B", (), {"platform": "manylinux_2_28"})})()
    builder.env = env
    return builder


def _target(tmp_path: Path) -> wheels.BuildTarget:
    return wheels.BuildTarget("3.12", tmp_path / "python3.12", True, ("3.12", "3.13"))


def test_the_cache_key_follows_the_environment_the_build_runs_with(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    target = _target(tmp_path)
    plain = _builder(tmp_path, dict(BASE_ENV))._cache_key(target)
    assert _builder(tmp_path, dict(BASE_ENV))._cache_key(target) == plain  # deterministic
    for name, value in (("CXXFLAGS", "-O0"), ("TensorRT_ROOT", "/opt/trt")):
        changed = _builder(tmp_path, {**BASE_ENV, name: value})._cache_key(target)
        assert changed != plain, name


def test_license_files_are_the_ones_scikit_build_core_puts_in_the_wheel() -> None:
    assert pyproject()["project"]["license-files"] == list(LICENSE_FILES)
    assert set(LICENSE_FILES) <= set(SOURCE_ROOTS)


@pytest.mark.parametrize("name", ["LICENSE", "NOTICE", "LICENSES/other.txt"])
def test_a_root_licence_file_changes_the_source_digest(tmp_path: Path, name: str) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "a.cpp").write_text("int a;\n")
    (tmp_path / "CMakeLists.txt").write_text("project(x)\n")
    (tmp_path / name).parent.mkdir(exist_ok=True)
    before = _source_digest(tmp_path)
    (tmp_path / name).write_text("terms\n")
    added = _source_digest(tmp_path)
    assert added != before
    (tmp_path / name).write_text("other terms\n")
    assert _source_digest(tmp_path) not in (before, added)


def test_the_long_description_is_a_wheel_input_and_the_readme_is_not(tmp_path: Path) -> None:
    readme = pyproject()["project"]["readme"]
    assert readme["file"] in SOURCE_ROOTS and "README.md" not in SOURCE_ROOTS
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "a.cpp").write_text("int a;\n")
    (tmp_path / readme["file"]).write_text("what it is\n")
    (tmp_path / "README.md").write_text("lab notes\n")
    before = _source_digest(tmp_path)
    (tmp_path / "README.md").write_text("more lab notes\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("x\n")
    assert _source_digest(tmp_path) == before
    (tmp_path / readme["file"]).write_text("what it is, and how to install it\n")
    assert _source_digest(tmp_path) != before


# --- item 2: CUDA files and the full nvcc version ---


def _fake_cuda(root: Path) -> None:
    for candidates in CUDA_FILES.values():
        path = root / candidates[-1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(path.name.encode())


def test_cuda_files_are_found_in_either_layout(tmp_path: Path) -> None:
    _fake_cuda(tmp_path)
    found = cuda_files(tmp_path)
    assert sorted(found) == sorted(CUDA_FILES)
    assert {"cudart_static", "cicc", "ptxas", "cuda_h"} <= set(found)


def test_a_missing_cuda_file_is_named(tmp_path: Path) -> None:
    _fake_cuda(tmp_path)
    (tmp_path / CUDA_FILES["ptxas"][-1]).unlink()
    with pytest.raises(BuildError, match=r"expected ptxas at one of \['bin/ptxas'\]"):
        cuda_files(tmp_path)


def test_a_changed_cuda_digest_in_the_record_changes_the_toolchain_key() -> None:
    defines = {"CMAKE_BUILD_TYPE": "Release"}
    record = {"nvcc": "13.0", "nvcc_version": "13.0.88", "cudart_static_sha256": "a" * 64}
    key = toolchain_key(defines, record)
    assert toolchain_key(defines, {**record, "cudart_static_sha256": "b" * 64}) != key
    assert toolchain_key(defines, {**record, "nvcc_version": "13.0.89"}) != key
    assert toolchain_key(defines, {**record, "cudart_static_path": "/elsewhere"}) == key


def test_nvcc_version_is_the_full_one() -> None:
    text = "Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.1_0\n"
    assert toolchain_module._NVCC_VERSION.search(text).group(1) == "13.0.88"
    assert toolchain_module._NVCC_RELEASE.search(text).group(1) == "13.0"


# --- item 3: the NVIDIA compiler wheels follow their pins ---


def test_changed_pins_reinstall_the_compiler_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = ["nvidia-cuda-nvcc==13.0.88"]
    installs: list[list[str]] = []

    def fake_pip(command: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        staging = Path(command[command.index("--target") + 1])
        installs.append(command[command.index("--target") + 2 :])
        lib = staging / "nvidia" / "cu13" / "lib"
        lib.mkdir(parents=True)
        (lib / "libcudart.so.13").write_text("")
        (staging / "nvidia" / "cu13" / "bin").mkdir()
        (staging / "nvidia" / "cu13" / "bin" / "nvcc").write_text(" ".join(pins))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(toolchain_module, "dependency_group", lambda name: list(pins))
    monkeypatch.setattr(toolchain_module.subprocess, "run", fake_pip)
    target = tmp_path / "cuda-wheels"
    root = toolchain_module._install_cuda_wheels(target)
    assert installs == [pins] and "installing" in capsys.readouterr().out
    assert (target / PINS_STAMP).is_file()

    toolchain_module._install_cuda_wheels(target)  # same pins: nothing installed, nothing said
    assert len(installs) == 1 and capsys.readouterr().out == ""

    pins[0] = "nvidia-cuda-nvcc==13.0.99"
    toolchain_module._install_cuda_wheels(target)
    assert installs[-1] == ["nvidia-cuda-nvcc==13.0.99"] and len(installs) == 2
    assert "installing" in capsys.readouterr().out
    assert (root / "bin" / "nvcc").read_text() == "nvidia-cuda-nvcc==13.0.99"


# --- item 4: ccache's compiler check sees a new zig ---


def test_the_wrapper_text_names_zigs_digest(tmp_path: Path) -> None:
    wrapper = tmp_path / "zig-clang++"
    argv = ["/same/path/zig", "c++", "-target", "x86_64-linux-gnu.2.28"]
    toolchain_module._write_wrapper(wrapper, argv, "a" * 64)
    old = hashlib.sha256(wrapper.read_bytes()).hexdigest()
    toolchain_module._write_wrapper(wrapper, argv, "b" * 64)  # a new zig at the same path
    assert hashlib.sha256(wrapper.read_bytes()).hexdigest() != old
    assert "b" * 64 in wrapper.read_text() and os.access(wrapper, os.X_OK)
