"""The reproducible gate: two clean builds from two source copies at different paths must give
identical wheels; a planted build-path leak must make it fail and be located."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from release.builder.reproduce import run_reproduce_gate, snapshot
from release.manifest import load_manifest
from release.util.wheel_diff import wheel_differences

pytestmark = pytest.mark.integration  # builds every wheel twice with the real toolchain

REPO = Path(__file__).resolve().parent.parent
MANIFEST = load_manifest(REPO / "manifests" / "activekv.toml")
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
CACHE = REPO / ".activekv" / "cache"


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_differences_name_the_member_and_the_first_byte(tmp_path):
    first = _zip(tmp_path / "a.whl", {"activekv/_engine.so": b"abcdef", "x/METADATA": b"m"})
    second = _zip(tmp_path / "b.whl", {"activekv/_engine.so": b"abcXef", "x/RECORD": b"r"})
    found = wheel_differences(first, second)
    assert "activekv/_engine.so: first difference at byte 3 (6 and 6 bytes)" in found
    assert "x/METADATA: only in the first build" in found
    assert "x/RECORD: only in the second build" in found


def test_a_release_wheel_the_rebuild_did_not_make_is_a_fail(tmp_path, monkeypatch):
    """A release wheel under another name (another platform tag) was never compared; that is
    no pass. The builds are stubbed: both rebuilds make the same wheel."""
    from release.builder import reproduce

    rebuilt = _zip(tmp_path / "activekv-0.1.0-cp312-abi3-manylinux_2_28_x86_64.whl", {"m": b"1"})

    report = SimpleNamespace(wheels=[SimpleNamespace(path=rebuilt)])
    monkeypatch.setattr(reproduce, "source_date_epoch", lambda source: 1)
    monkeypatch.setattr(reproduce, "snapshot", lambda source, destination: destination)
    monkeypatch.setattr(reproduce, "build_wheels", lambda *args, **kwargs: report)
    out = tmp_path / "out"
    (out / "wheels").mkdir(parents=True)
    _zip(out / "wheels" / "activekv-0.1.0-cp312-abi3-manylinux_2_27_x86_64.whl", {"m": b"2"})
    evidence = run_reproduce_gate(MANIFEST, source_dir=REPO, out_dir=out, cache_dir=CACHE)
    assert evidence.verdict == "fail"
    assert "manylinux_2_27_x86_64.whl (release build): the rebuild made no wheel" in (
        evidence.reason
    )


def test_snapshot_copies_tracked_and_untracked_but_not_ignored(tmp_path):
    copy = snapshot(REPO, tmp_path / "copy")
    assert (copy / "engine" / "offload" / "engine.cpp").is_file()
    assert (copy / "pyproject.toml").read_bytes() == (REPO / "pyproject.toml").read_bytes()
    assert not (copy / ".activekv").exists() and not (copy / "out").exists()


# What a wheel is made of: the sources (release/util/paths.py SOURCE_ROOTS: the native code, the
# shim, pyproject, the long description DESCRIPTION.md, the licence files) and the toolchain.
# Everything else a checkout holds must leave its bytes alone.
NOT_WHEEL_INPUTS = ("README.md", "docs/architecture.md", "tests/conftest.py", "reference/engine.py",
                    ".github/workflows/release.yml")  # fmt: skip


def test_two_clean_builds_are_bit_identical(tmp_path, monkeypatch):
    """The second copy also differs in every file that is not a wheel input: still the same
    wheel (an edit to the README or docs/ voids no GPU attestation)."""
    from release.builder import reproduce

    def snapshot_with_other_files_changed(source: Path, destination: Path) -> Path:
        copy = snapshot(source, destination)
        if "elsewhere" in destination.parts:  # the second copy
            for name in NOT_WHEEL_INPUTS:
                with (copy / name).open("a") as changed:
                    changed.write("\n# changed in the second copy only\n")
        return copy

    monkeypatch.setattr(reproduce, "snapshot", snapshot_with_other_files_changed)
    evidence = run_reproduce_gate(
        MANIFEST, source_dir=REPO, out_dir=tmp_path, cache_dir=CACHE, only=[PYTHON]
    )
    assert evidence.verdict == "pass", evidence.reason
    assert len(evidence.artefacts) == 1
    (wheel,) = (tmp_path / "reproduce" / "out-a" / "wheels").glob("activekv-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        long_description = archive.read(metadata).decode().split("\n\n", 1)[1]
    assert long_description.strip() == (REPO / "DESCRIPTION.md").read_text().strip()


def test_a_planted_path_leak_is_caught(tmp_path):
    """Negative control: a module that embeds its absolute source path (__FILE__) differs
    between the two copies, and the gate names the module and the byte."""
    project = snapshot(REPO, tmp_path / "project")
    # A compile definition carrying the absolute source path: -ffile-prefix-map cannot reach it.
    cmake = project / "engine" / "CMakeLists.txt"
    text = cmake.read_text()
    planted = 'ACTIVEKV_CXX_COMPILER="${CMAKE_CURRENT_SOURCE_DIR}"'
    cmake.write_text(
        text.replace('ACTIVEKV_CXX_COMPILER="${CMAKE_CXX_COMPILER_ID} ', planted + " #")
    )
    assert planted in cmake.read_text()
    # The leak is in _engine, which the gate names: the planted copy builds that module alone,
    # not _fabric and _vllm (nor the fabric library only _fabric links), sparing each of the two
    # cold builds their compilation; the gate still compares every member of both wheels.
    bindings = project / "bindings" / "CMakeLists.txt"
    only_engine = bindings.read_text()
    for line, kept in (("activekv_module(_fabric fabric.cpp activekv_fabric)\n", ""),
                       ("activekv_module(_vllm vllm_connector.cpp activekv_offload)\n", ""),
                       ("add_dependencies(_vllm_stub _engine)\n", ""),
                       ("IN ITEMS _engine _fabric _vllm)", "IN ITEMS _engine)")):  # fmt: skip
        assert line in only_engine, f"bindings/CMakeLists.txt no longer has {line!r}"
        only_engine = only_engine.replace(line, kept)
    only_engine += "set_target_properties(activekv_fabric PROPERTIES EXCLUDE_FROM_ALL ON)\n"
    bindings.write_text(only_engine)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    commit = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "planted"]
    for command in (["git", "init", "-q"], ["git", "add", "-A"], commit):
        subprocess.run(command, cwd=project, env=env, check=True)
    shutil.rmtree(project / "out", ignore_errors=True)
    # The leak is in C++ (_engine): one CUDA architecture is enough around it, and spares each
    # of the two cold builds nvcc's passes for the others.
    cuda = MANIFEST.build.cuda.model_copy(update={"architectures": ("80",)})
    manifest = MANIFEST.model_copy(
        update={"build": MANIFEST.build.model_copy(update={"cuda": cuda})}
    )
    evidence = run_reproduce_gate(
        manifest, source_dir=project, out_dir=tmp_path / "out", cache_dir=CACHE, only=[PYTHON]
    )
    if evidence.verdict == "pass":
        pytest.fail("a wheel embedding its source path was judged reproducible")
    assert "activekv/_engine" in evidence.reason and "first difference at byte" in evidence.reason
