"""The casters gate (release/gates/casters.py, release/scripts/caster_scan.py).

The built wheel must pass: every signature of its native modules names Python types only. The
negative controls: a real nanobind module compiled here (host g++, the pinned nanobind) with a
function whose argument type has no caster, shipped in a fixture wheel; a scanner run over
callables of every kind; and a wheel whose native module does not import. The scan must judge
the wheel and nothing else: a regular ``activekv`` in the interpreter's site-packages, a native
module that forges the scanner's output on stdout or prints at import, and a report that misses a
module or names a file outside the install folder are planted here.
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
    ScanError,
    coverage_problems,
    missing_casters,
    native_modules,
    raw_cpp_names,
    read_report,
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

    work = tmp_path_factory.mktemp("planted")
    root = Path(nanobind.__file__).parent
    module = compile_module(
        work, "_planted", MISSING_CASTER_MODULE, f"-I{nanobind.include_dir()}",
        f"-I{root / 'ext' / 'robin_map' / 'include'}", str(root / "src" / "nb_combined.cpp"),
    )  # fmt: skip
    return this_interpreter_wheel(work / "dist", {f"activekv/{module.name}": module.read_bytes()})


def compile_module(work: Path, name: str, source: str, *extra: str) -> Path:
    """`source` compiled by the host g++ into the extension module `name` for this interpreter."""
    gxx = shutil.which("g++")
    assert gxx is not None, "g++ compiles the fixture module (README: apt-get install g++)"
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.cpp").write_text(source)
    module = work / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        [gxx, "-shared", "-fPIC", "-O0", "-std=c++17", "-fvisibility=hidden",
         f"-I{sysconfig.get_paths()['include']}", *extra, str(work / f"{name}.cpp"),
         "-o", str(module)],
        check=True, capture_output=True,
    )  # fmt: skip
    return module


def this_interpreter_wheel(dest: Path, files: dict[str, bytes]) -> Path:
    """A wheel named `activekv` for this interpreter holding `files`."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return build_files_wheel(
        dest, files, name="activekv", version="0.1.0", tag=f"{tag}-{tag}-linux_x86_64"
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
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-I", "-S", str(SCANNER), "--report", str(report), "--site",
         str(tmp_path), "planted"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    loaded = json.loads(report.read_text())
    assert loaded["flags"] == {"isolated": 1, "no_site": 1}
    [module] = loaded["modules"]
    assert module["file"] == str(tmp_path / "planted.py")
    scanned = module["entries"]
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


# --- the scan judges the wheel's own modules, and speaks only through its report

# PyInit writes what the old gate parsed from stdout as "no signatures", and exits before Python
# could write anything else.
FORGED_OUTPUT_MODULE = r"""
#include <Python.h>
#include <cstdio>
#include <unistd.h>
PyMODINIT_FUNC PyInit__forged(void) {
  std::printf("[]");
  std::fflush(stdout);
  _exit(0);
}
"""

# A well-formed module that prints a line as it is imported.
CHATTY_MODULE = r"""
#include <Python.h>
#include <cstdio>
static PyModuleDef chatty = {PyModuleDef_HEAD_INIT, "_chatty", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit__chatty(void) {
  std::printf("hello from _chatty\n");
  std::fflush(stdout);
  return PyModule_Create(&chatty);
}
"""


def this_python(_: str) -> Path:
    return Path(sys.executable)


@pytest.mark.integration  # g++ compiles the module, pip installs the wheel
def test_a_module_that_forges_the_scan_on_stdout_fails_quoting_it(tmp_path: Path) -> None:
    module = compile_module(tmp_path / "build", "_forged", FORGED_OUTPUT_MODULE)
    wheel = this_interpreter_wheel(
        tmp_path / "dist", {f"activekv/{module.name}": module.read_bytes()}
    )
    evidence = run_casters_gate(wheel_set(wheel), tmp_path / "out", find_python=this_python)
    assert evidence.verdict == "fail"
    assert evidence.reason.startswith(
        f"{wheel.name}: the scanner exited 0 without writing its report caster-scan.json; "
        "stdout: '[]'"
    ), evidence.reason


@pytest.mark.integration  # g++ compiles the module, pip installs the wheel
def test_a_module_that_prints_at_import_is_still_judged(tmp_path: Path) -> None:
    module = compile_module(tmp_path / "build", "_chatty", CHATTY_MODULE)
    wheel = this_interpreter_wheel(
        tmp_path / "dist", {f"activekv/{module.name}": module.read_bytes()}
    )
    evidence = run_casters_gate(wheel_set(wheel), tmp_path / "out", find_python=this_python)
    assert evidence.verdict == "pass", evidence.reason
    figures = evidence.figures["wheels"][wheel.name]
    assert figures["modules"] == ["activekv._chatty"]
    assert figures["signatures"] == 0


def shadowed_interpreter(venv: Path) -> Path:
    """A venv of this interpreter whose site-packages holds a regular `activekv` package (an
    ``__init__.py``) with a pure-Python `_planted` that has no signatures at all."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    shadow = Path(purelib) / "activekv"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "_planted.py").write_text("def take(lease):\n    return lease\n")
    return python


def test_a_regular_activekv_in_site_packages_cannot_stand_in_for_the_wheel(
    missing_caster_wheel: Path, tmp_path: Path
) -> None:
    python = shadowed_interpreter(tmp_path / "venv")
    # The control is live: with site-packages on the path, the regular package wins over the
    # wheel's namespace package even with the install folder first.
    site = tmp_path / "site"
    with zipfile.ZipFile(missing_caster_wheel) as archive:
        archive.extractall(site)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import activekv._planted as m; "
        "print(m.__file__)"
    )
    shadowed = subprocess.run(
        [str(python), "-I", "-c", probe, str(site)], capture_output=True, text=True, check=True
    )
    assert not Path(shadowed.stdout.strip()).is_relative_to(site)
    evidence = run_casters_gate(
        wheel_set(missing_caster_wheel), tmp_path / "out", find_python=lambda _: python
    )
    assert evidence.verdict == "fail"
    assert evidence.figures["wheels"][missing_caster_wheel.name]["missing"] == [
        "activekv._planted.take"
    ]


def scan_report(site: Path, files: dict[str, str], **flags: int) -> dict[str, object]:
    return {
        "flags": {"isolated": 1, "no_site": 1, **flags},
        "modules": [{"name": name, "file": file, "entries": []} for name, file in files.items()],
    }


def test_a_report_that_does_not_cover_the_installed_wheel_is_a_problem(tmp_path: Path) -> None:
    site = tmp_path / "site"
    ours = str(site / "activekv" / "_engine.abi3.so")
    wheel_modules = ["activekv._engine", "activekv._fabric"]
    assert (
        coverage_problems(
            scan_report(site, {"activekv._engine": ours, "activekv._fabric": ours}),
            site,
            wheel_modules,
        )
        == []
    )
    elsewhere = "/usr/lib/python3/site-packages/activekv/_fabric.py"
    assert coverage_problems(
        scan_report(site, {"activekv._engine": ours, "activekv._fabric": elsewhere}),
        site,
        wheel_modules,
    ) == [f"activekv._fabric: imported from {elsewhere}, expected a file under {site.resolve()}"]
    assert coverage_problems(
        scan_report(site, {"activekv._engine": ours}), site, wheel_modules
    ) == ["activekv._fabric: in the wheel, not in the scanner's report"]
    assert coverage_problems(
        scan_report(site, {"activekv._engine": ours, "activekv._fabric": ours}, no_site=0),
        site,
        wheel_modules,
    ) == [
        "expected the scanner to run isolated, without site (-I -S); flags "
        "{'isolated': 1, 'no_site': 0}"
    ]


def test_an_unreadable_report_is_a_failure_quoting_the_output(tmp_path: Path) -> None:
    report = tmp_path / "caster-scan.json"
    report.write_text("{not json")
    result = subprocess.CompletedProcess(["scan"], 0, stdout="noise\n", stderr="warning\n")
    with pytest.raises(
        ScanError, match=r"expected a JSON report .*stdout: 'noise'; stderr: 'warning'"
    ):
        read_report(report, result)
    report.write_text("[]")
    with pytest.raises(ScanError, match=r"expected a report .* got '\[\]'"):
        read_report(report, result)
