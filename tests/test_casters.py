"""The casters gate (release/gates/casters.py, release/scripts/caster_scan.py).

The built wheel must pass: every signature of its native modules names Python types only. The
negative controls: a real nanobind module compiled here (host g++, the pinned nanobind) with a
function whose argument type has no caster, shipped in a fixture wheel; a scanner run over
callables of every kind; and a wheel whose native module does not import.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from fixtures_wheels import build_files_wheel, wheel_set

from release.gates.casters import (
    SCANNER,
    missing_casters,
    native_modules,
    raw_cpp_names,
    run_casters_gate,
)
from release.manifest import Manifest, load_manifest
from release.util.digests import sha256_file

REPO = Path(__file__).resolve().parents[1]

# A module whose callables carry nanobind's signature attribute, as a function bound without the
# caster of its argument type would: nanobind prints the C++ type's name where a Python type goes.
PLANTED = """
class _Bound:
    def __init__(self, *signatures):
        self.__nb_signature__ = tuple((s, None, None) for s in signatures)

    def __call__(self, *args):
        raise TypeError("incompatible function arguments")


lookup = _Bound("def lookup(hashes: collections.abc.Sequence[int]) -> int")
take_leases = _Bound(
    "def take_leases(self, pool: activekv::offload::StagingPool) -> "
    "std::vector<activekv::offload::Lease, std::allocator<activekv::offload::Lease>>"
)


class Engine:
    events = _Bound("def events(self) -> list[tuple[str, int]]")
    fatal = property(_Bound("def fatal(self) -> bool"))
"""


# A real module with a missing caster: `Lease` is never bound, so nanobind writes its C++ name.
MISSING_CASTER_MODULE = """
#include <nanobind/nanobind.h>
namespace fixture { struct Lease { int region; }; }
NB_MODULE(_planted, m) {
  m.def("count", [](int blocks) { return blocks + 1; });
  m.def("take", [](const fixture::Lease& lease) { return lease.region; });
}
"""


@pytest.fixture(scope="module")
def missing_caster_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel for this interpreter holding `activekv._planted`, compiled with nanobind."""
    import nanobind

    gxx = shutil.which("g++")
    assert gxx is not None, "g++ compiles the fixture module (README: apt-get install g++)"
    work = tmp_path_factory.mktemp("planted")
    (work / "planted.cpp").write_text(MISSING_CASTER_MODULE)
    root = Path(nanobind.__file__).parent
    module = work / f"_planted{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        [gxx, "-shared", "-fPIC", "-O0", "-std=c++17", "-fvisibility=hidden",
         f"-I{nanobind.include_dir()}", f"-I{root / 'ext' / 'robin_map' / 'include'}",
         f"-I{sysconfig.get_paths()['include']}", str(root / "src" / "nb_combined.cpp"),
         str(work / "planted.cpp"), "-o", str(module)],
        check=True, capture_output=True,
    )  # fmt: skip
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return build_files_wheel(
        work / "dist",
        {f"activekv/{module.name}": module.read_bytes()},
        name="activekv",
        version="0.1.0",
        tag=f"{tag}-{tag}-linux_x86_64",
    )


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REPO / "manifests" / "activekv.toml")


@pytest.mark.parametrize(
    ("signature", "raw"),
    [
        ("def f(words: NDArray[numpy.uint32], /) -> int", []),
        ("def g(self, x: int = 3) -> dict[str, list[tuple[int, int]]]", []),
        (
            "def h(arg: std::set<long, std::less<long>, std::allocator<long>>, /) -> None",
            ["std::set", "std::less", "std::allocator"],
        ),
        ("def k(self) -> activekv::offload::Lease", ["activekv::offload::Lease"]),
        (
            "def m(x: (anonymous namespace)::BoundEngine) -> None",
            ["(anonymous namespace)::BoundEngine"],
        ),
    ],
)
def test_raw_cpp_names(signature: str, raw: list[str]) -> None:
    assert raw_cpp_names(signature) == raw


def test_planted_missing_caster_is_found_naming_the_function(tmp_path: Path) -> None:
    (tmp_path / "planted.py").write_text(PLANTED)
    result = subprocess.run(
        [sys.executable, "-I", str(SCANNER), str(tmp_path), "planted"],
        capture_output=True,
        text=True,
        check=True,
    )
    scanned = json.loads(result.stdout)
    assert {entry["name"] for entry in scanned} == {
        "planted.lookup",
        "planted.take_leases",
        "planted.Engine.events",
        "planted.Engine.fatal",
    }
    missing = missing_casters("fixture.whl", scanned)
    assert {m.function for m in missing} == {"planted.take_leases"}
    assert str(missing[0]).startswith(
        "fixture.whl: planted.take_leases: raw C++ type 'activekv::offload::StagingPool'"
    )


def test_a_real_missing_caster_fails_the_gate_naming_the_function(
    manifest: Manifest, missing_caster_wheel: Path, tmp_path: Path
) -> None:
    evidence = run_casters_gate(
        wheel_set(missing_caster_wheel),
        tmp_path / "out",
        find_python=lambda _: Path(sys.executable),
    )
    assert evidence.verdict == "fail"
    assert evidence.figures["failures"] == [
        f"{missing_caster_wheel.name}: activekv._planted.take: raw C++ type 'fixture::Lease' in "
        '`def take(arg: "fixture::Lease", /) -> int`'
    ]
    assert evidence.figures["wheels"][missing_caster_wheel.name]["missing"] == [
        "activekv._planted.take"
    ]


def test_built_wheel_has_a_caster_for_every_type(
    manifest: Manifest, built_wheel: Path, tmp_path: Path
) -> None:
    evidence = run_casters_gate(wheel_set(built_wheel), tmp_path / "out")
    assert evidence.verdict == "pass", evidence.reason
    assert evidence.artefacts == {built_wheel.name: sha256_file(built_wheel)}
    figures = evidence.figures["wheels"][built_wheel.name]
    assert figures["modules"] == ["activekv._engine", "activekv._fabric", "activekv._vllm"]
    assert figures["signatures"] > 40  # every function, method and property of three modules
    assert figures["missing"] == []


def test_a_native_module_that_does_not_import_fails(
    manifest: Manifest, built_wheel: Path, tmp_path: Path
) -> None:
    broken = tmp_path / built_wheel.name
    with zipfile.ZipFile(built_wheel) as source, zipfile.ZipFile(broken, "w") as target:
        for item in source.infolist():
            target.writestr(item, source.read(item))
        target.writestr("activekv/_broken.abi3.so", b"\x7fELF not a module")
    assert "activekv._broken" in native_modules(broken)
    evidence = run_casters_gate(wheel_set(broken), tmp_path / "out")
    assert evidence.verdict == "fail"
    assert evidence.reason.startswith(f"{broken.name}: importing the native modules")
    assert "_broken" in evidence.reason


def test_a_wheel_without_its_interpreter_is_not_run(
    manifest: Manifest, built_wheel: Path, tmp_path: Path
) -> None:
    evidence = run_casters_gate(
        wheel_set(built_wheel), tmp_path / "out", find_python=lambda version: None
    )
    assert evidence.verdict == "not-run"
    version = wheel_set(built_wheel).wheels[0].python
    assert evidence.reason == f"not run: {built_wheel.name}: no python{version} to import it with"
