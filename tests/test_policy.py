"""The policy gate (release/gates/policy.py) with the real `auditwheel show`.

Fixture wheels hold real ELF shared objects: one compiled by zig for glibc 2.28 (passes), and
negative controls that each must fail: a host-gcc object calling GLIBC_2.34 symbols, a vendored
libcudart, a DT_NEEDED libcudart, and a file name claiming a newer policy than the manifest's.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import run_tool, zig_binary
from fixtures_wheels import wheel_set

from release.evidence import Evidence, evidence_path
from release.gates.policy import run_policy_gate, shown_policy, tag_glibc
from release.manifest import Manifest, load_manifest
from release.util.digests import sha256_file

REAL = Path(__file__).resolve().parents[1] / "manifests" / "activekv.toml"
ZIG_TARGET = "x86_64-linux-gnu.2.28"
MODULE = "activekv/_x.cpython-311-x86_64-linux-gnu.so"
DECLARED_TAG = "manylinux_2_28_x86_64"

C_PLAIN = "#include <unistd.h>\nint probe(void) { return (int)getpid(); }\n"
# pthread_create, pthread_join and dlopen moved into libc with new versions in glibc 2.34.
C_GLIBC_234 = """\
#include <dlfcn.h>
#include <pthread.h>
static void* run(void* arg) { return arg; }
int probe(void) {
    pthread_t thread;
    void* handle = dlopen("libm.so.6", RTLD_NOW);
    if (pthread_create(&thread, 0, run, handle) != 0) return 1;
    return pthread_join(thread, 0);
}
"""
C_CUDART_STUB = "int cudaFree(void* pointer) { (void)pointer; return 0; }\n"
C_CALLS_CUDART = "int cudaFree(void*);\nint probe(void) { return cudaFree(0); }\n"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def platform_wheel(
    directory: Path,
    module: Path,
    *,
    platforms: tuple[str, ...] = (DECLARED_TAG,),
    extra: dict[str, bytes] | None = None,
) -> Path:
    """A valid platform wheel (Root-Is-Purelib: false, RECORD, tags in name and WHEEL) holding
    `module` as activekv/_x.cpython-311-x86_64-linux-gnu.so, plus `extra` members."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = "activekv-0.0.1.dist-info"
    tags = [f"cp311-cp311-{platform}" for platform in platforms]
    files = {
        MODULE: module.read_bytes(),
        **(extra or {}),
        f"{dist_info}/METADATA": b"Metadata-Version: 2.1\nName: activekv\nVersion: 0.0.1\n",
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests.test_policy\nRoot-Is-Purelib: false\n"
            + "".join(f"Tag: {tag}\n" for tag in tags)
        ).encode(),
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = directory / f"activekv-0.0.1-cp311-cp311-{'.'.join(platforms)}.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 2, 2, 0, 0, 0))
            info.external_attr = 0o755 << 16 if name.endswith(".so") else 0o644 << 16
            archive.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    return path


@dataclass(frozen=True)
class Objects:
    zig_228: Path  # C by zig for glibc 2.28
    gcc_234: Path  # C by the host gcc, calling GLIBC_2.34 symbols
    cudart_stub: Path  # a stub with soname libcudart.so.13
    needs_cudart: Path  # C by zig with DT_NEEDED libcudart.so.13


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> Objects:
    zig = zig_binary()
    if zig is None:
        pytest.skip("zig is missing (install the pinned `ziglang` of the build dependency group)")
    root = tmp_path_factory.mktemp("policy")
    sources = {"plain": C_PLAIN, "glibc234": C_GLIBC_234, "stub": C_CUDART_STUB}
    sources["calls"] = C_CALLS_CUDART
    for name, text in sources.items():
        (root / f"{name}.c").write_text(text)
    made = Objects(
        zig_228=root / "zig_228.so",
        gcc_234=root / "gcc_234.so",
        cudart_stub=root / "stub" / "libcudart.so.13",
        needs_cudart=root / "needs_cudart.so",
    )
    made.cudart_stub.parent.mkdir()
    zig_cc = (zig, "cc", "-target", ZIG_TARGET, "-O2", "-shared", "-fPIC")
    run_tool(*zig_cc, root / "plain.c", "-o", made.zig_228)
    run_tool(*zig_cc, "-Wl,-soname,libcudart.so.13", root / "stub.c", "-o", made.cudart_stub)
    run_tool(*zig_cc, root / "calls.c", "-Wl,--no-as-needed", f"-L{made.cudart_stub.parent}",
         "-l:libcudart.so.13", "-o", made.needs_cudart)  # fmt: skip
    gcc = shutil.which("gcc")
    if gcc is not None:
        run_tool(gcc, "-shared", "-fPIC", "-O1", root / "glibc234.c", "-o", made.gcc_234)
    return made


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REAL)


def _read_evidence(out: Path) -> dict:
    return json.loads(evidence_path(out, "policy").read_text())


def _assert_fails(evidence: Evidence, wheel: Path, *phrases: str) -> None:
    assert evidence.verdict == "fail", evidence.figures
    for phrase in phrases:
        assert f"{wheel.name}: " in evidence.reason
        assert phrase in evidence.reason, evidence.reason


def test_declared_policy_is_manylinux_2_28(manifest: Manifest) -> None:
    assert manifest.build.platform == DECLARED_TAG
    assert manifest.build.glibc == (2, 28)


@pytest.mark.parametrize(
    ("tag", "glibc"),
    [
        ("manylinux_2_28_x86_64", (2, 28)),
        ("manylinux_2_34_x86_64", (2, 34)),
        ("manylinux2014_x86_64", (2, 17)),
        ("manylinux2010_x86_64", (2, 12)),
        ("manylinux1_x86_64", (2, 5)),
        ("linux_x86_64", None),
        ("musllinux_1_2_x86_64", None),
    ],
)
def test_tag_glibc(tag: str, glibc: tuple[int, int] | None) -> None:
    assert tag_glibc(tag) == glibc


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
def test_zig_built_wheel_passes(objects: Objects, manifest: Manifest, tmp_path: Path) -> None:
    wheel = platform_wheel(tmp_path / "dist", objects.zig_228)
    tag, shown = shown_policy(wheel)
    assert tag.startswith("manylinux_") and shown <= (2, 28)
    out = tmp_path / "out"
    evidence = run_policy_gate(manifest, wheel_set(wheel), out)
    assert evidence.verdict == "pass", evidence.reason
    record = _read_evidence(out)
    assert record["verdict"] == "pass"
    assert record["artefacts"] == {wheel.name: sha256_file(wheel)}
    assert record["figures"]["declared"] == DECLARED_TAG
    assert record["figures"]["wheels"][wheel.name] == {"auditwheel_show": tag}


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
def test_wheel_repaired_by_auditwheel_passes(
    objects: Objects, manifest: Manifest, tmp_path: Path
) -> None:
    # `auditwheel repair --plat manylinux_2_28_x86_64` of an older-policy object adds the older
    # tags beside the requested one, legacy aliases included (manylinux1, manylinux2014).
    raw = platform_wheel(tmp_path / "raw", objects.zig_228, platforms=("linux_x86_64",))
    repaired_dir = tmp_path / "repaired"
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "SOURCE_DATE_EPOCH": "1700000000",
    }
    result = subprocess.run(
        [sys.executable, "-m", "auditwheel", "repair", "--plat", DECLARED_TAG,
         "-w", str(repaired_dir), str(raw)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (repaired,) = repaired_dir.glob("*.whl")
    assert DECLARED_TAG in repaired.name and "manylinux1_x86_64" in repaired.name
    evidence = run_policy_gate(manifest, wheel_set(repaired), tmp_path / "out")
    assert evidence.verdict == "pass", evidence.reason


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
def test_glibc_234_symbols_fail_naming_the_newer_policy(
    objects: Objects, manifest: Manifest, tmp_path: Path
) -> None:
    if not objects.gcc_234.exists():
        pytest.skip("the host gcc is missing")
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is missing")
    symbols = run_tool(readelf, "--dyn-syms", "-W", objects.gcc_234)
    versioned = set(re.findall(r"\b(pthread_create|pthread_join|dlopen)@GLIBC_2\.34\b", symbols))
    if not versioned:
        pytest.skip("the host glibc is older than 2.34: its gcc cannot plant GLIBC_2.34 symbols")
    wheel = platform_wheel(tmp_path / "dist", objects.gcc_234)
    evidence = run_policy_gate(manifest, wheel_set(wheel), tmp_path / "out")
    _assert_fails(evidence, wheel, "auditwheel show reports manylinux_2_34_x86_64", "newer than")
    assert evidence.figures["wheels"][wheel.name] == {"auditwheel_show": "manylinux_2_34_x86_64"}
    assert _read_evidence(tmp_path / "out")["verdict"] == "fail"


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
def test_vendored_cudart_fails(objects: Objects, manifest: Manifest, tmp_path: Path) -> None:
    vendored = "activekv.libs/libcudart-1234abcd.so.13"
    wheel = platform_wheel(
        tmp_path / "dist", objects.zig_228, extra={vendored: objects.cudart_stub.read_bytes()}
    )
    evidence = run_policy_gate(manifest, wheel_set(wheel), tmp_path / "out")
    _assert_fails(evidence, wheel, f"{vendored}: a vendored CUDA library")


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
@pytest.mark.parametrize(
    "library",
    ["libcudnn_ops-1a2b.so.9", "libnvinfer_plugin-3c4d.so.10", "libcusparseLt-5e6f.so.0",
     "libcufftw-7a8b.so.11", "libcudart-1234abcd.so.13"],
)  # fmt: skip
def test_every_library_of_a_cuda_family_is_vendored_cuda(
    objects: Objects, manifest: Manifest, tmp_path: Path, library: str
) -> None:
    vendored = f"activekv.libs/{library}"
    wheel = platform_wheel(tmp_path / "dist", objects.zig_228, extra={vendored: b"not ELF"})
    evidence = run_policy_gate(manifest, wheel_set(wheel), tmp_path / "out")
    _assert_fails(evidence, wheel, f"{vendored}: a vendored CUDA library")


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
def test_needed_cudart_fails(objects: Objects, manifest: Manifest, tmp_path: Path) -> None:
    readelf = shutil.which("readelf")
    if readelf is not None:
        assert "Shared library: [libcudart.so.13]" in run_tool(readelf, "-d", objects.needs_cudart)
    wheel = platform_wheel(tmp_path / "dist", objects.needs_cudart)
    # auditwheel show reports a needed library outside every manylinux policy as linux_x86_64:
    # the gate must still judge (verdict fail, with the CUDA library named), not give up.
    evidence = run_policy_gate(manifest, wheel_set(wheel), tmp_path / "out")
    _assert_fails(evidence, wheel, f"{MODULE}: needs libcudart.so.13 (expected static cudart)")
    assert _read_evidence(tmp_path / "out")["verdict"] == "fail"


def _without_section_headers(elf: bytes) -> bytes:
    """The object with its section header table dropped from the ELF header (e_shoff, e_shnum,
    e_shstrndx zeroed), as a stripped or crafted module may be: the loader needs only segments."""
    data = bytearray(elf)
    data[0x28:0x30] = bytes(8)  # e_shoff
    data[0x3C:0x40] = bytes(4)  # e_shnum, e_shstrndx
    return bytes(data)


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
def test_needed_cudart_is_found_by_the_bytes_not_the_name_or_the_sections(
    objects: Objects, manifest: Manifest, tmp_path: Path
) -> None:
    hidden = "activekv/helper.bin"  # an ELF member whose name says nothing of .so
    wheel = platform_wheel(tmp_path / "dist", objects.zig_228, extra={
        hidden: _without_section_headers(objects.needs_cudart.read_bytes()),
        "activekv/NOTES.so.txt": b"not an ELF file, though its name holds .so",
    })  # fmt: skip
    evidence = run_policy_gate(manifest, wheel_set(wheel), tmp_path / "out")
    _assert_fails(evidence, wheel, f"{hidden}: needs libcudart.so.13 (expected static cudart)")
    assert "NOTES" not in evidence.reason


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
def test_file_name_claiming_a_newer_policy_fails(
    objects: Objects, manifest: Manifest, tmp_path: Path
) -> None:
    wheel = platform_wheel(tmp_path / "dist", objects.zig_228, platforms=("manylinux_2_34_x86_64",))
    _, shown = shown_policy(wheel)
    assert shown <= (2, 28)  # the objects are fine: only the claim is wrong
    evidence = run_policy_gate(manifest, wheel_set(wheel), tmp_path / "out")
    _assert_fails(evidence, wheel, "platform tag manylinux_2_34_x86_64 is newer than the declared")


@pytest.mark.integration  # zig and gcc compile its objects (the objects fixture)
def test_one_failing_wheel_fails_the_gate_and_every_digest_is_recorded(
    objects: Objects, manifest: Manifest, tmp_path: Path
) -> None:
    good = platform_wheel(tmp_path / "good", objects.zig_228)
    bad = platform_wheel(
        tmp_path / "bad", objects.zig_228, platforms=(DECLARED_TAG, "manylinux_2_34_x86_64")
    )
    out = tmp_path / "out"
    evidence = run_policy_gate(manifest, wheel_set(good, bad), out)
    assert evidence.verdict == "fail"
    assert evidence.figures["failures"] == [
        f"{bad.name}: platform tag manylinux_2_34_x86_64 is newer than the declared policy"
    ]
    assert _read_evidence(out)["artefacts"] == {
        good.name: sha256_file(good),
        bad.name: sha256_file(bad),
    }
