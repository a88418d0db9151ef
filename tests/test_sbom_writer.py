"""cmake/write_sbom.py on small ELF files made here: every bad input is one line naming the file,
argument or variable and what was expected (never a traceback), nothing half-written is left, and
a library two modules link differently is not given one linkage for both.

The modules are a tiny `cc -shared` object, with the fact section `.activekv_sbom`
(engine/common/sbom_facts.h) added by objcopy, so any bytes can be planted in it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
GOOD_FACTS = {
    "cxx_runtime": "libc++ 220108",
    "cuda_runtime": "13000",
    "cuda_architectures": "80-real",
    "nanobind": "2.9.2",
    "robin_map": "1.4.0",
}
EPOCH = "1700000000"

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or shutil.which("objcopy") is None,
    reason="needs a C compiler (cc) and objcopy to make small ELF files",
)


@pytest.fixture(scope="module")
def writer() -> ModuleType:
    """cmake/write_sbom.py, imported as the script it is (it is no package module)."""
    spec = importlib.util.spec_from_file_location("write_sbom", REPO / "cmake" / "write_sbom.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*command: str | Path) -> None:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    assert done.returncode == 0, f"{command}: {done.stderr}"


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two shared objects without facts: one loading nothing, one with DT_NEEDED libc++.so.1."""
    folder = tmp_path_factory.mktemp("elf")
    (folder / "module.c").write_text("int activekv_probe(void) { return 1; }\n")
    stub = folder / "libc++.so.1"
    _run("cc", "-shared", "-fPIC", "-o", stub, "-Wl,-soname,libc++.so.1", folder / "module.c")
    static = folder / "static.so"
    _run("cc", "-shared", "-fPIC", "-o", static, folder / "module.c")
    dynamic = folder / "dynamic.so"
    _run("cc", "-shared", "-fPIC", "-o", dynamic, folder / "module.c", "-Wl,--no-as-needed", stub)
    return {"static": static, "dynamic": dynamic}


@pytest.fixture
def module(bases: dict[str, Path], tmp_path: Path) -> Callable[..., Path]:
    """A module whose fact section holds `facts` (name -> value, or raw bytes)."""

    def make(
        facts: dict[str, str] | bytes = GOOD_FACTS, linkage: str = "static", name: str = "m"
    ) -> Path:
        raw = facts if isinstance(facts, bytes) else _section(facts)
        (tmp_path / f"{name}.facts").write_bytes(raw)
        out = tmp_path / f"{name}.so"
        _run(
            "objcopy",
            "--add-section",
            f".activekv_sbom={tmp_path / f'{name}.facts'}",
            bases[linkage],
            out,
        )
        return out

    return make


def _section(facts: dict[str, str]) -> bytes:
    return b"".join(f"{name}={value}".encode() + b"\0" for name, value in facts.items())


def writer_arguments(out: Path, modules: list[str], extra: Sequence[str] = ()) -> list[str]:
    """The arguments CMake gives the writer after `--module NAME=PATH=FILE` ones (`modules`);
    sys.executable stands in for every tool binary (only its digest is taken)."""
    tool = sys.executable
    return [
        "--out",
        str(out),
        "--name",
        "activekv",
        "--version",
        "0.1.0",
        *modules,
        "--cmake",
        tool,
        "--cmake-version",
        "4.4.5",
        "--nvcc",
        tool,
        "--nvcc-version",
        "13.0.88",
        "--cxx-compiler",
        tool,
        "--cxx-compiler-version",
        "Clang 22.1.8",
        "--scikit-build-core",
        "1.1.2",
        *extra,
    ]


def _arguments(out: Path, *modules: Path | str, extra: tuple[str, ...] = ()) -> list[str]:
    """The writer's command line over these modules (a Path: a made-up import name for it)."""
    given = []
    for number, built in enumerate(modules):
        spec = (
            built
            if isinstance(built, str)
            else f"activekv._m{number}=activekv/m{number}.so={built}"
        )
        given += ["--module", spec]
    return ["write_sbom.py", *writer_arguments(out, given, extra)]


def _write(
    writer: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    epoch: str | None = EPOCH,
) -> tuple[int, str]:
    """The writer's exit status and its stderr, run in this process as CMake runs it."""
    monkeypatch.setattr(sys, "argv", argv)
    if epoch is None:
        monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    else:
        monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
    status = writer.main()
    return status, capsys.readouterr().err


@pytest.fixture
def write(
    writer: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str]]:
    def run(argv: list[str], epoch: str | None = EPOCH) -> tuple[int, str]:
        return _write(writer, monkeypatch, capsys, argv, epoch)

    return run


def _refused(done: tuple[int, str], *named: str) -> None:
    status, stderr = done
    assert status == 1, stderr
    assert stderr.startswith("write_sbom.py: ") and stderr.count("\n") == 1, stderr
    for text in named:
        assert text in stderr, stderr


# ----------------------------------------------------------------------------- the good case


def test_a_good_module_gives_an_sbom_dated_by_source_date_epoch(module, write, tmp_path):
    out = tmp_path / "sbom.json"
    status, stderr = write(_arguments(out, module()))
    assert status == 0, stderr
    document = json.loads(out.read_text())
    assert document["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"
    names = {c["name"]: c for c in document["components"]}
    assert names["libc++"]["version"] == "22.1.8" and names["cudart"]["version"] == "13.0"
    assert sorted(p.name for p in tmp_path.iterdir() if "sbom" in p.name) == ["sbom.json"]


@pytest.mark.parametrize(
    ("epoch", "stamp"),
    [
        ("0", "1970-01-01T00:00:00+00:00"),
        ("253402300799", "9999-12-31T23:59:59+00:00"),
        (None, None),
    ],
)
def test_source_date_epoch_at_its_bounds_or_unset(module, write, tmp_path, epoch, stamp):
    out = tmp_path / "sbom.json"
    status, stderr = write(_arguments(out, module()), epoch=epoch)
    assert status == 0, stderr
    assert json.loads(out.read_text())["metadata"].get("timestamp") == stamp


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "spec", ["activekv._engine", "activekv._engine=activekv/_engine.so", "=a.so=/x.so", "a==/x"]
)
def test_a_module_argument_without_its_three_parts_is_named(write, tmp_path, spec):
    done = write(_arguments(tmp_path / "sbom.json", spec))
    _refused(done, f"--module {spec!r}: expected IMPORT_NAME=PATH_IN_WHEEL=INSTALLED_FILE")


def test_a_module_given_twice_is_refused(module, write, tmp_path):
    built = module()
    twice = [f"activekv._m=activekv/m.so={built}"] * 2
    _refused(write(_arguments(tmp_path / "sbom.json", *twice)), "expected each module once")


def test_a_tool_binary_that_is_not_there_is_named(module, write, tmp_path):
    argv = _arguments(tmp_path / "sbom.json", module())
    argv[argv.index("--nvcc") + 1] = str(tmp_path / "no-nvcc")
    _refused(write(argv), f"--nvcc {tmp_path / 'no-nvcc'}: expected the binary CMake ran")


# ----------------------------------------------------------------------------- modules


def test_a_module_that_is_not_there_is_named(write, tmp_path):
    missing = tmp_path / "gone.so"
    done = write(_arguments(tmp_path / "sbom.json", missing))
    _refused(done, f"{missing}: expected a built module; cannot read it (No such file")


@pytest.mark.parametrize("content", [b"not an ELF file\n", b"\x7fELF\x02\x01\x01" + b"\0" * 9])
def test_a_module_that_is_not_elf_is_named(write, tmp_path, content):
    fake = tmp_path / "fake.so"
    fake.write_bytes(content)
    _refused(write(_arguments(tmp_path / "sbom.json", fake)), f"{fake}: expected an ELF shared")


def test_a_module_without_the_fact_section_is_named(bases, write, tmp_path):
    done = write(_arguments(tmp_path / "sbom.json", bases["static"]))
    _refused(done, f"{bases['static']}: no .activekv_sbom section")


@pytest.mark.parametrize(
    ("facts", "named"),
    [
        (b"nanobind=2.9.2\0cxx_runtime=libc++ \xff\0", "expected UTF-8 name=value facts"),
        (b"nanobind=2.9.2\0nanobind=2.9.3\0", "conflicting or malformed fact"),
        ({**GOOD_FACTS, "cxx_runtime": "libc++ 22.1.8"}, "cxx_runtime: expected 'libc++ ' and"),
        ({**GOOD_FACTS, "cxx_runtime": "libc++"}, "cxx_runtime: expected 'libc++ ' and"),
        ({**GOOD_FACTS, "cxx_runtime": "libstdc++ 14.2"}, "cxx_runtime: expected 'libstdc++ '"),
        ({**GOOD_FACTS, "cxx_runtime": "msvc 1940"}, "cxx_runtime: expected 'libc++ VERSION' or"),
        ({**GOOD_FACTS, "cuda_runtime": "13.0"}, "cuda_runtime: expected CUDART_VERSION's"),
        ({**GOOD_FACTS, "cuda_runtime": ""}, "cuda_runtime: expected CUDART_VERSION's"),
    ],
)
def test_a_malformed_fact_is_named_with_its_module(module, write, tmp_path, facts, named):
    built = module(facts)
    _refused(write(_arguments(tmp_path / "sbom.json", built)), f"{built}: .activekv_sbom: ", named)


def test_a_libstdcxx_release_number_is_accepted(module, write, tmp_path):
    out = tmp_path / "sbom.json"
    status, stderr = write(_arguments(out, module({**GOOD_FACTS, "cxx_runtime": "libstdc++ 14"})))
    assert status == 0, stderr
    assert "libstdc++" in {c["name"] for c in json.loads(out.read_text())["components"]}


def test_no_nanobind_fact_and_no_record_is_named(module, write, tmp_path):
    facts = {k: v for k, v in GOOD_FACTS.items() if k != "nanobind"}
    done = write(_arguments(tmp_path / "sbom.json", module(facts)))
    _refused(done, "--module: expected a module that records the nanobind fact")


def test_modules_that_disagree_on_nanobind_are_refused(module, write, tmp_path):
    first, second = module(name="a"), module({**GOOD_FACTS, "nanobind": "2.9.3"}, name="b")
    done = write(_arguments(tmp_path / "sbom.json", first, second))
    _refused(done, f"{second}: .activekv_sbom: nanobind: expected '2.9.2'", "got '2.9.3'")


# ----------------------------------------------------------------------------- linkage


def _linked(document: dict[str, Any], module_ref: str) -> dict[str, str]:
    """name -> activekv:linkage of what the module depends on."""
    by_ref = {c["bom-ref"]: c for c in document["components"]}
    (refs,) = [d["dependsOn"] for d in document["dependencies"] if d["ref"] == module_ref]
    return {by_ref[r]["name"]: by_ref[r]["properties"][0]["value"] for r in refs}


def test_a_library_linked_statically_and_dynamically_gets_a_component_each(module, write, tmp_path):
    out = tmp_path / "sbom.json"
    static, dynamic = module(name="s"), module(linkage="dynamic", name="d")
    status, stderr = write(_arguments(out, static, dynamic))
    assert status == 0, stderr
    document = json.loads(out.read_text())
    assert _linked(document, "activekv._m0")["libc++"] == "static"
    assert _linked(document, "activekv._m1")["libc++"] == "dynamic"
    refs = [c["bom-ref"] for c in document["components"] if c["name"] == "libc++"]
    assert sorted(refs) == ["libc++@22.1.8:dynamic", "libc++@22.1.8:static"]


def test_modules_that_agree_on_linkage_share_the_component(module, write, tmp_path):
    out = tmp_path / "sbom.json"
    status, stderr = write(_arguments(out, module(name="a"), module(name="b")))
    assert status == 0, stderr
    document = json.loads(out.read_text())
    assert [c["bom-ref"] for c in document["components"] if c["name"] == "libc++"] == [
        "libc++@22.1.8:static"
    ]
    assert _linked(document, "activekv._m1")["libc++"] == "static"


# ----------------------------------------------------------------------------- the record


def _record(tool: str) -> dict[str, str]:
    digest = hashlib.sha256(Path(tool).resolve().read_bytes()).hexdigest()
    record = {
        "zig": "0.15.1",
        "nvcc": "13.0",
        # What release/builder/toolchain.py records: the host compiler's --version first line.
        "cuda_host_compiler": "g++ (Debian 12.2.0-14+deb12u1) 12.2.0",
        "cmake": "4.4.5",
        "nanobind": "2.9.2",
        "scikit-build-core": "1.1.2",
    }
    record |= {f"{name}_sha256": digest for name in list(record)}
    return record | {"nvcc_version": "13.0.88"}


def test_a_record_that_matches_names_its_tools(module, write, tmp_path):
    (tmp_path / "record.json").write_text(json.dumps(_record(sys.executable)))
    out = tmp_path / "sbom.json"
    extra = ("--toolchain-record", str(tmp_path / "record.json"))
    status, stderr = write(_arguments(out, module(), extra=extra))
    assert status == 0, stderr
    tools = {t["name"] for t in json.loads(out.read_text())["metadata"]["tools"]["components"]}
    assert "zig" in tools and "cxx-compiler" not in tools


def _tool_versions(out: Path) -> dict[str, str]:
    tools = json.loads(out.read_text())["metadata"]["tools"]["components"]
    return {tool["name"]: tool.get("version") for tool in tools}


def test_the_tools_carry_version_numbers_not_banners(module, write, tmp_path):
    """nvcc's exact version (13.0.88, not the release 13.0 the record also holds), the host
    compiler's number out of its --version line, the compiler's out of CMake's "<id> <version>"."""
    (tmp_path / "record.json").write_text(json.dumps(_record(sys.executable)))
    out = tmp_path / "sbom.json"
    extra = ("--toolchain-record", str(tmp_path / "record.json"))
    status, stderr = write(_arguments(out, module(), extra=extra))
    assert status == 0, stderr
    assert _tool_versions(out) == {
        "zig": "0.15.1",
        "nvcc": "13.0.88",
        "cuda-host-compiler": "12.2.0",
        "cmake": "4.4.5",
        "nanobind": "2.9.2",
        "scikit-build-core": "1.1.2",
        "cyclonedx-python-lib": _tool_versions(out)["cyclonedx-python-lib"],
    }
    status, stderr = write(_arguments(out, module()))
    assert status == 0, stderr
    versions = _tool_versions(out)
    observed = (versions["cxx-compiler"], versions["nvcc"], versions["cmake"])
    assert observed == ("22.1.8", "13.0.88", "4.4.5")


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("13.0.88", "13.0.88"),
        ("Clang 22.1.8", "22.1.8"),
        ("GNU 12.2.0", "12.2.0"),
        ("g++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022", "12.2.0"),
        ("clang version 19.1.7 (https://github.com/llvm/llvm-project abc)", "19.1.7"),
        ("Ubuntu clang version 18.1.3 (1ubuntu1)", "18.1.3"),
        ("0.16.0-dev.1234+0123abcd", "0.16.0-dev.1234+0123abcd"),
    ],
)
def test_a_version_is_read_out_of_what_a_tool_says(writer, text, version):
    assert writer.tool_version("--x", text) == version


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--cxx-compiler-version", "Clang"),
        ("--cxx-compiler-version", "g++ (Debian 12.2.0-14) twelve"),
        ("--nvcc-version", "13.0"),
        ("--cmake-version", "cmake version 4.4"),
        ("--scikit-build-core", ""),
    ],
)
def test_a_tool_version_that_is_no_version_number_is_named(module, write, tmp_path, flag, value):
    argv = _arguments(tmp_path / "sbom.json", module())
    argv[argv.index(flag) + 1] = value
    _refused(write(argv), f"{flag}: expected a version major.minor.patch", repr(value))
    assert not (tmp_path / "sbom.json").exists()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            {"cuda_host_compiler": "g++ (Debian)"},
            "toolchain record: cuda_host_compiler: expected a version major.minor.patch",
        ),
        (
            {"nvcc_version": "13.0.48"},
            "toolchain record: nvcc_version: expected what this build ran, '13.0.88'; got "
            "'13.0.48'",
        ),
    ],
)
def test_a_record_whose_version_is_no_number_or_another_is_refused(
    module, write, tmp_path, change, named
):
    (tmp_path / "record.json").write_text(json.dumps(_record(sys.executable) | change))
    extra = ("--toolchain-record", str(tmp_path / "record.json"))
    _refused(write(_arguments(tmp_path / "sbom.json", module(), extra=extra)), named)


# ----------------------------------------------------------------------------- the package


def test_the_package_carries_pyproject_licence_and_each_module_its_digest(module, write, tmp_path):
    out = tmp_path / "sbom.json"
    built = module()
    status, stderr = write(_arguments(out, built))
    assert status == 0, stderr
    document = json.loads(out.read_text())
    assert document["metadata"]["component"]["licenses"] == [{"expression": "Apache-2.0"}]
    (engine,) = [c for c in document["components"] if c["name"] == "activekv._m0"]
    assert engine["hashes"] == [
        {"alg": "SHA-256", "content": hashlib.sha256(built.read_bytes()).hexdigest()}
    ]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (None, "expected the project's pyproject.toml; cannot read it (No such file"),
        ("[project\n", "expected TOML; got"),
        ("[project]\nname = 'activekv'\n", "project.license: expected an SPDX licence expression"),
        ("[project]\nlicense = { text = 'Apache' }\n", "project.license: expected an SPDX"),
        ("[project]\nlicense = 'Apache 2'\n", "project.license: expected an SPDX licence"),
    ],
)
def test_a_pyproject_without_an_spdx_licence_is_named(module, write, tmp_path, text, named):
    pyproject = tmp_path / "pyproject.toml"
    if text is not None:
        pyproject.write_text(text)
    extra = ("--pyproject", str(pyproject))
    _refused(
        write(_arguments(tmp_path / "sbom.json", module(), extra=extra)), str(pyproject), named
    )


def test_the_licence_is_spelled_as_metadata_spells_it(module, write, tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nlicense = 'apache-2.0 OR mit'\n")
    out = tmp_path / "sbom.json"
    extra = ("--pyproject", str(tmp_path / "pyproject.toml"))
    status, stderr = write(_arguments(out, module(), extra=extra))
    assert status == 0, stderr
    licenses = json.loads(out.read_text())["metadata"]["component"]["licenses"]
    assert licenses == [{"expression": "Apache-2.0 OR MIT"}]


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (None, "expected the pipeline's toolchain record; cannot read it (No such file"),
        ("{not json", "expected a JSON object; got a file that is not JSON"),
        ("[]", "expected a JSON object; got list"),
        ('"zig"', "expected a JSON object; got str"),
    ],
)
def test_a_record_that_is_not_a_json_object_is_named(module, write, tmp_path, content, named):
    record = tmp_path / "record.json"
    if content is not None:
        record.write_text(content)
    done = write(
        _arguments(tmp_path / "sbom.json", module(), extra=("--toolchain-record", str(record)))
    )
    _refused(done, f"--toolchain-record {record}: {named}")
    assert not (tmp_path / "sbom.json").exists()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda r: {}, "toolchain record: expected the keys ['zig', 'zig_sha256'"),
        (lambda r: r | {"zig": 15}, "toolchain record: zig: expected a string; got 15"),
        (lambda r: r | {"nanobind": "2.9.3"}, "toolchain record: nanobind: expected what this"),
    ],
)
def test_a_record_that_is_empty_or_wrong_is_refused(module, write, tmp_path, change, named):
    record = tmp_path / "record.json"
    record.write_text(json.dumps(change(_record(sys.executable))))
    done = write(
        _arguments(tmp_path / "sbom.json", module(), extra=("--toolchain-record", str(record)))
    )
    _refused(done, named)


# ----------------------------------------------------------------------------- SOURCE_DATE_EPOCH


@pytest.mark.parametrize(
    "epoch", ["abc", "-1", "1.5", " 1700000000", "1700000000\n", "", "99999999999999", "²"]
)
def test_a_malformed_source_date_epoch_is_named(module, write, tmp_path, epoch):
    done = write(_arguments(tmp_path / "sbom.json", module()), epoch=epoch)
    _refused(done, "SOURCE_DATE_EPOCH: expected whole seconds since 1970", f"got {epoch!r}")


# ----------------------------------------------------------------------------- the output


def test_an_out_that_is_a_folder_is_named_and_nothing_is_left(module, write, tmp_path):
    out = tmp_path / "activekv.cdx.json"
    out.mkdir()
    _refused(write(_arguments(out, module())), f"--out {out}: expected a file", "it is a folder")
    assert sorted(p.name for p in tmp_path.iterdir() if "cdx" in p.name) == ["activekv.cdx.json"]


def test_an_out_in_a_missing_folder_is_named(module, write, tmp_path):
    out = tmp_path / "absent" / "sbom.json"
    _refused(write(_arguments(out, module())), f"--out {out}: cannot write the SBOM")


def test_a_failed_rename_leaves_no_partial_file(module, write, tmp_path, monkeypatch):
    def refuse(self: Path, target: Path) -> None:
        raise PermissionError(13, "Permission denied")

    out = tmp_path / "out" / "sbom.json"
    out.parent.mkdir()
    built = module()
    monkeypatch.setattr(Path, "replace", refuse)
    _refused(write(_arguments(out, built)), f"--out {out}: cannot write the SBOM")
    assert list(out.parent.iterdir()) == []
