"""pyproject.toml's [tool.cibuildwheel] (the path for CI systems with manylinux containers) must
build what manifests/activekv.toml declares: the same interpreters, policy, architectures, CUDA
architectures and pinned NVIDIA compiler wheels as the hermetic build.

Each check is a function of the config, so each has a negative control: a planted drift that the
check must report.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from release.manifest import Manifest, load_manifest
from release.util.pins import dependency_group, pyproject

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "manifests" / "activekv.toml"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REAL)


@pytest.fixture(scope="module")
def cibw() -> dict[str, Any]:
    config = pyproject()["tool"]["cibuildwheel"]
    assert isinstance(config, dict)
    return config


def linux(config: dict[str, Any], key: str) -> Any:
    """An option as cibuildwheel reads it for Linux: [tool.cibuildwheel.linux] overrides."""
    return config.get("linux", {}).get(key, config.get(key))


def words(value: Any) -> list[str]:
    """A cibuildwheel list option: a TOML array or a space-separated string."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else value.split()


def _python_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


# --- the checks ---


def build_problems(config: dict[str, Any], manifest: Manifest) -> list[str]:
    arch = manifest.build.arch
    abi3_from = _python_tuple(manifest.build.stable_abi_from)
    below = [v for v in manifest.build.python if _python_tuple(v) < abi3_from]
    builders = [*below, manifest.build.stable_abi_from]  # one abi3 wheel, built with the oldest
    expected = [f"cp{v.replace('.', '')}-manylinux_{arch}" for v in builders]
    got = words(config.get("build"))
    return [] if got == expected else [f"build: expected {expected}; got {got}"]


def image_problems(config: dict[str, Any], manifest: Manifest) -> list[str]:
    arch = manifest.build.arch
    expected = manifest.build.platform.removesuffix(f"_{arch}")  # manylinux_2_28
    got = linux(config, f"manylinux-{arch}-image")
    return [] if got == expected else [f"manylinux-{arch}-image: expected {expected}; got {got}"]


def repair_problems(config: dict[str, Any], manifest: Manifest) -> list[str]:
    command = linux(config, "repair-wheel-command")
    commands = command if isinstance(command, list) else [command or ""]
    plats: list[str] = []
    for line in commands:
        argv = shlex.split(line)
        if "repair" not in argv:
            continue
        for index, arg in enumerate(argv):
            if arg == "--plat" and index + 1 < len(argv):
                plats.append(argv[index + 1])
            elif arg.startswith("--plat="):
                plats.append(arg.split("=", 1)[1])
    expected = [manifest.build.platform]
    return [] if plats == expected else [f"repair --plat: expected {expected}; got {plats}"]


def archs_problems(config: dict[str, Any], manifest: Manifest) -> list[str]:
    got = words(linux(config, "archs"))
    expected = [manifest.build.arch]
    return [] if got == expected else [f"archs: expected {expected}; got {got}"]


def cmake_defines(config: dict[str, Any]) -> dict[str, str]:
    """The CMake defines scikit-build-core receives from the cibuildwheel settings.

    Mirrors scikit-build-core: SKBUILD_CMAKE_DEFINE is split on every ';' (no escaping) into
    KEY=VALUE entries; config-settings `cmake.define.KEY` keep their value whole; CMAKE_ARGS is
    split like a shell line into -DKEY[:TYPE]=VALUE words. A ValueError means scikit-build-core
    would refuse the setting.
    """
    defines: dict[str, str] = {}
    environment = linux(config, "environment") or {}
    if isinstance(environment, str):
        environment = dict(word.split("=", 1) for word in shlex.split(environment))
    if value := environment.get("SKBUILD_CMAKE_DEFINE"):
        for entry in value.split(";"):
            key, equals, item = entry.strip().partition("=")
            if not equals:
                raise ValueError(
                    f"SKBUILD_CMAKE_DEFINE={value!r}: scikit-build-core splits it on ';', and the "
                    f"entry {entry!r} is no KEY=VALUE (a CMake list cannot be passed this way)"
                )
            defines[key] = item
    for word in shlex.split(environment.get("CMAKE_ARGS", "")):
        if match := re.fullmatch(r"-D([^:=]+)(?::\w+)?=(.*)", word):
            defines[match.group(1)] = match.group(2)
    settings = linux(config, "config-settings") or {}
    if isinstance(settings, str):
        settings = dict(word.split("=", 1) for word in shlex.split(settings))
    for key, value in settings.items():
        if key.startswith("cmake.define."):
            defines[key.removeprefix("cmake.define.")] = (
                ";".join(value) if isinstance(value, list) else str(value)
            )
    return defines


def cuda_problems(config: dict[str, Any], manifest: Manifest) -> list[str]:
    expected = ";".join(manifest.build.cuda.architectures)
    try:
        defines = cmake_defines(config)
    except ValueError as error:
        return [str(error)]
    got = defines.get("ACTIVEKV_CUDA_ARCHITECTURES")
    problems = []
    if got != expected:
        problems.append(f"ACTIVEKV_CUDA_ARCHITECTURES: expected {expected!r}; got {got!r}")
    if "CMAKE_CUDA_ARCHITECTURES" in defines:
        problems.append(
            "CMAKE_CUDA_ARCHITECTURES: CMakeLists.txt derives it from "
            "ACTIVEKV_CUDA_ARCHITECTURES; a define of its own is ignored"
        )
    return problems


def _requirements(command: str) -> list[str]:
    return [word for word in shlex.split(command) if re.fullmatch(r"[A-Za-z0-9._-]+==\S+", word)]


def before_all_problems(config: dict[str, Any], pins: list[str]) -> list[str]:
    before_all = linux(config, "before-all")
    lines = before_all if isinstance(before_all, list) else [before_all or ""]
    got = sorted(req for line in lines for req in _requirements(line))
    expected = sorted(pins)
    return [] if got == expected else [f"before-all pins: expected {expected}; got {got}"]


# --- the real pyproject.toml ---


def test_build_selectors_follow_the_manifest(cibw: dict[str, Any], manifest: Manifest) -> None:
    assert words(cibw.get("build")) == [
        "cp310-manylinux_x86_64",
        "cp311-manylinux_x86_64",
        "cp312-manylinux_x86_64",
    ]
    assert build_problems(cibw, manifest) == []


def test_manylinux_image_follows_the_platform(cibw: dict[str, Any], manifest: Manifest) -> None:
    assert image_problems(cibw, manifest) == []


def test_repair_plat_is_the_platform(cibw: dict[str, Any], manifest: Manifest) -> None:
    assert repair_problems(cibw, manifest) == []


def test_archs_are_the_platform_arch(cibw: dict[str, Any], manifest: Manifest) -> None:
    assert archs_problems(cibw, manifest) == []


def test_cmakelists_reads_activekv_cuda_architectures() -> None:
    text = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"set\(ACTIVEKV_CUDA_ARCHITECTURES\s+\"\"\s+CACHE STRING", text)
    assert "FATAL_ERROR" in text.split("if(NOT ACTIVEKV_CUDA_ARCHITECTURES)", 1)[1][:200]


def test_cuda_architectures_follow_the_manifest(cibw: dict[str, Any], manifest: Manifest) -> None:
    assert cuda_problems(cibw, manifest) == []


def test_scikit_build_core_reads_the_same_cuda_architectures(
    cibw: dict[str, Any], manifest: Manifest
) -> None:
    """Cross-check cmake_defines with scikit-build-core's own settings reader."""
    reader_module = pytest.importorskip("scikit_build_core.settings.skbuild_read_settings")
    environment = linux(cibw, "environment") or {}
    settings = linux(cibw, "config-settings") or {}
    if isinstance(environment, str) or isinstance(settings, str):
        pytest.skip("string-form environment/config-settings: covered by the parser above only")
    try:
        reader = reader_module.SettingsReader(
            pyproject(), dict(settings), state="wheel", env=dict(environment)
        )
        defines = dict(reader.settings.cmake.define)
    except Exception as error:  # scikit-build-core raises an ExceptionGroup
        pytest.fail(f"scikit-build-core refuses the cibuildwheel settings: {error!r}")
    assert defines.get("ACTIVEKV_CUDA_ARCHITECTURES") == ";".join(manifest.build.cuda.architectures)


def test_the_standard_build_takes_the_manifests_cuda_architectures(manifest: Manifest) -> None:
    """`pip wheel .` and `python -m build` pass no settings: pyproject's own defines say it."""
    reader_module = pytest.importorskip("scikit_build_core.settings.skbuild_read_settings")
    reader = reader_module.SettingsReader(pyproject(), {}, state="wheel", env={})
    defines = dict(reader.settings.cmake.define)
    assert defines.get("ACTIVEKV_CUDA_ARCHITECTURES") == ";".join(manifest.build.cuda.architectures)


def test_before_all_installs_the_cuda_compiler_pins(cibw: dict[str, Any]) -> None:
    assert before_all_problems(cibw, dependency_group("cuda-compiler")) == []


# --- negative controls: each check reports a planted drift ---


GOOD: dict[str, Any] = {
    "build": ["cp310-manylinux_x86_64", "cp311-manylinux_x86_64", "cp312-manylinux_x86_64"],
    "archs": ["x86_64"],
    "manylinux-x86_64-image": "manylinux_2_28",
    "config-settings": {"cmake.define.ACTIVEKV_CUDA_ARCHITECTURES": "80;90;100"},
    "linux": {
        "before-all": "python3 -m pip install nvidia-a==1.0 nvidia-b==2.0",
        "repair-wheel-command": (
            "auditwheel repair --plat manylinux_2_28_x86_64 -w {dest_dir} {wheel}"
        ),
    },
}
PINS = ["nvidia-a==1.0", "nvidia-b==2.0"]


def planted(**changes: Any) -> dict[str, Any]:
    """GOOD with options replaced; keyword names use '_' for '-' (config_settings=...)."""
    config = copy.deepcopy(GOOD)
    for name, value in changes.items():
        key = name.replace("_", "-").replace("x86-64", "x86_64")
        if key in config["linux"]:
            config["linux"][key] = value
        else:
            config[key] = value
    return config


def test_the_reference_config_passes_every_check(manifest: Manifest) -> None:
    assert build_problems(GOOD, manifest) == []
    assert image_problems(GOOD, manifest) == []
    assert repair_problems(GOOD, manifest) == []
    assert archs_problems(GOOD, manifest) == []
    assert cuda_problems(GOOD, manifest) == []
    assert before_all_problems(GOOD, PINS) == []


@pytest.mark.parametrize(
    "build",
    [
        ["cp310-manylinux_x86_64", "cp311-manylinux_x86_64"],  # the abi3 wheel forgotten
        [*GOOD["build"], "cp313-manylinux_x86_64"],  # 3.13 is served by the abi3 wheel
        ["cp310-manylinux_x86_64", "cp311-manylinux_x86_64", "cp313-manylinux_x86_64"],
        "cp3*-manylinux_x86_64",
    ],
)
def test_build_drift_is_reported(manifest: Manifest, build: Any) -> None:
    assert build_problems(planted(build=build), manifest)


def test_image_drift_is_reported(manifest: Manifest) -> None:
    assert image_problems(planted(manylinux_x86_64_image="manylinux2014"), manifest)
    config = planted()
    config["linux"]["manylinux-x86_64-image"] = "manylinux_2_34"  # the linux table overrides
    assert image_problems(config, manifest)


def test_repair_drift_is_reported(manifest: Manifest) -> None:
    newer = "auditwheel repair --plat manylinux_2_34_x86_64 -w {dest_dir} {wheel}"
    assert repair_problems(planted(repair_wheel_command=newer), manifest)
    assert repair_problems(planted(repair_wheel_command="auditwheel repair {wheel}"), manifest)


def test_archs_drift_is_reported(manifest: Manifest) -> None:
    assert archs_problems(planted(archs=["x86_64", "aarch64"]), manifest)
    assert archs_problems(planted(archs="auto"), manifest)


@pytest.mark.parametrize(
    "settings",
    [
        {"config_settings": {"cmake.define.ACTIVEKV_CUDA_ARCHITECTURES": "80;90"}},
        {
            "config_settings": {},
            "environment": {"SKBUILD_CMAKE_DEFINE": "ACTIVEKV_BUILD_TESTS=OFF"},
        },
        # A CMake list in SKBUILD_CMAKE_DEFINE is split apart by scikit-build-core.
        {
            "config_settings": {},
            "environment": {"SKBUILD_CMAKE_DEFINE": "ACTIVEKV_CUDA_ARCHITECTURES=80;90;100"},
        },
        # CMakeLists.txt ignores CMAKE_CUDA_ARCHITECTURES and stops without ours.
        {
            "config_settings": {},
            "environment": {"SKBUILD_CMAKE_DEFINE": "CMAKE_CUDA_ARCHITECTURES=80-real"},
        },
    ],
)
def test_cuda_drift_is_reported(manifest: Manifest, settings: dict[str, Any]) -> None:
    assert cuda_problems(planted(**settings), manifest)


def test_cmake_args_carry_a_cmake_list(manifest: Manifest) -> None:
    config = planted(
        config_settings={},
        environment={"CMAKE_ARGS": "'-DACTIVEKV_CUDA_ARCHITECTURES:STRING=80;90;100'"},
    )
    assert cuda_problems(config, manifest) == []


def test_before_all_drift_is_reported() -> None:
    older = "python3 -m pip install nvidia-a==0.9 nvidia-b==2.0"
    assert before_all_problems(planted(before_all=older), PINS)
    missing = "python3 -m pip install nvidia-a==1.0"
    assert before_all_problems(planted(before_all=missing), PINS)
    unpinned = "python3 -m pip install nvidia-a nvidia-b==2.0"
    assert before_all_problems(planted(before_all=unpinned), PINS)
