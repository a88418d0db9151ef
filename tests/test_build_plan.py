"""Which wheels `python -m release build` plans (release/builder/wheels.py plan_targets), and where
SOURCE_DATE_EPOCH comes from (source_date_epoch). Interpreters are injected: no build runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from release.builder import wheels
from release.builder.wheels import (
    BuildTarget,
    SkippedPython,
    cibuildwheel_selector,
    plan_container_targets,
    plan_targets,
    source_date_epoch,
)
from release.errors import BuildError
from release.manifest import Manifest, load_manifest

REAL = Path(__file__).resolve().parents[1] / "manifests" / "activekv.toml"
SERVED = "served by the stable-ABI wheel built with 3.12"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(REAL)


def finder(versions: Iterable[str]) -> Callable[[str], Path | None]:
    """A `find` that knows exactly `versions`, at fake paths."""
    known = {version: Path(f"/fake/bin/python{version}") for version in versions}
    return known.get


def python(version: str) -> Path:
    return Path(f"/fake/bin/python{version}")


def test_manifest_matrix_is_the_one_planned_here(manifest: Manifest) -> None:
    assert manifest.build.python == ("3.10", "3.11", "3.12", "3.13")
    assert manifest.build.stable_abi_from == "3.12"


def test_every_interpreter_present(manifest: Manifest) -> None:
    targets, skipped = plan_targets(manifest, find=finder(["3.10", "3.11", "3.12", "3.13"]))
    assert targets == [
        BuildTarget("3.10", python("3.10"), False, ("3.10",)),
        BuildTarget("3.11", python("3.11"), False, ("3.11",)),
        BuildTarget("3.12", python("3.12"), True, ("3.12", "3.13")),
    ]
    assert skipped == [SkippedPython("3.13", SERVED)]


def test_missing_version_specific_interpreter_is_skipped_with_its_reason(
    manifest: Manifest,
) -> None:
    targets, skipped = plan_targets(manifest, find=finder(["3.11", "3.12", "3.13"]))
    assert [t.python for t in targets] == ["3.11", "3.12"]
    assert SkippedPython("3.10", "no python3.10 on PATH or under pyenv") in skipped
    assert SkippedPython("3.13", SERVED) in skipped
    assert len(skipped) == 2


def test_only_a_newer_abi3_version_still_plans_the_abi3_wheel(manifest: Manifest) -> None:
    targets, skipped = plan_targets(
        manifest, only=["3.13"], find=finder(["3.10", "3.11", "3.12", "3.13"])
    )
    assert targets == [BuildTarget("3.12", python("3.12"), True, ("3.12", "3.13"))]
    assert skipped == [SkippedPython("3.13", SERVED)]


def test_only_version_specific_versions(manifest: Manifest) -> None:
    targets, skipped = plan_targets(
        manifest, only=["3.11"], find=finder(["3.10", "3.11", "3.12", "3.13"])
    )
    assert targets == [BuildTarget("3.11", python("3.11"), False, ("3.11",))]
    assert skipped == []


def test_abi3_wheel_is_built_with_the_oldest_available_abi3_version(manifest: Manifest) -> None:
    targets, skipped = plan_targets(manifest, find=finder(["3.10", "3.11", "3.13"]))
    assert targets[-1] == BuildTarget("3.13", python("3.13"), True, ("3.12", "3.13"))
    assert skipped == [
        SkippedPython("3.12", "served by the stable-ABI wheel built with 3.13"),
    ]


def test_undeclared_version_is_refused(manifest: Manifest) -> None:
    with pytest.raises(BuildError) as raised:
        plan_targets(manifest, only=["3.9"], find=finder(["3.9", "3.12"]))
    message = str(raised.value)
    assert "--python" in message
    assert "['3.10', '3.11', '3.12', '3.13']" in message
    assert "['3.9']" in message
    assert str(manifest.path) in message


def test_no_interpreter_at_all_skips_every_version(manifest: Manifest) -> None:
    targets, skipped = plan_targets(manifest, find=finder([]))
    assert targets == []
    assert skipped == [
        SkippedPython(version, f"no python{version} on PATH or under pyenv")
        for version in ("3.10", "3.11", "3.12", "3.13")
    ]


# --- SOURCE_DATE_EPOCH ---


@pytest.fixture
def no_git_discovery(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """git must not find a repository above tmp_path, nor one named by the environment."""
    for name in ("GIT_DIR", "GIT_WORK_TREE", "SOURCE_DATE_EPOCH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))


def test_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert source_date_epoch(tmp_path) == 1_700_000_000  # not a git repository: never asked


@pytest.mark.parametrize("value", ["17e8", "-1", "1700000000.5", " 1700000000", "now"])
def test_non_digit_environment_value_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    with pytest.raises(BuildError, match="SOURCE_DATE_EPOCH") as raised:
        source_date_epoch(tmp_path)
    assert repr(value) in str(raised.value)


def test_directory_without_commits_is_refused(no_git_discovery: None, tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is missing")
    with pytest.raises(BuildError, match="SOURCE_DATE_EPOCH") as raised:
        source_date_epoch(tmp_path)
    assert str(tmp_path) in str(raised.value)


def _commit(git: str, repo: Path, path: str, when: int) -> None:
    file = repo / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(f"changed at {when}\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_AUTHOR_DATE": f"@{when - 1000} +0000",
        "GIT_COMMITTER_DATE": f"@{when} +0000",
    }
    for command in (["add", path], ["commit", "-q", "-m", f"change {path}"]):
        subprocess.run([git, "-C", str(repo), *command], check=True, env=env)


def test_time_of_the_last_commit_to_the_sources_is_used(
    no_git_discovery: None, tmp_path: Path
) -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is missing")
    subprocess.run([git, "-C", str(tmp_path), "init", "-q"], check=True)
    _commit(git, tmp_path, "engine/cache.cpp", 1_600_000_000)
    assert source_date_epoch(tmp_path) == 1_600_000_000  # the committer's time
    _commit(git, tmp_path, "CMakeLists.txt", 1_650_000_000)
    assert source_date_epoch(tmp_path) == 1_650_000_000
    # A later commit outside what goes into a wheel leaves the epoch (and the bytes) alone.
    _commit(git, tmp_path, "tests/test_x.py", 1_700_000_000)
    assert source_date_epoch(tmp_path) == 1_650_000_000


def test_repository_without_source_commits_is_refused(
    no_git_discovery: None, tmp_path: Path
) -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is missing")
    subprocess.run([git, "-C", str(tmp_path), "init", "-q"], check=True)
    _commit(git, tmp_path, "docs/notes.md", 1_600_000_000)
    with pytest.raises(BuildError, match="SOURCE_DATE_EPOCH") as raised:
        source_date_epoch(tmp_path)
    assert str(tmp_path) in str(raised.value)


# --- --toolchain cibuildwheel ---


def test_cibuildwheel_plans_from_the_manifest_without_local_interpreters(
    manifest: Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: planning from local interpreters found none here, and CIBW_BUILD=''."""
    monkeypatch.setattr(wheels, "find_interpreter", lambda version: None)
    targets, skipped = plan_container_targets(manifest)
    assert [(t.python, t.stable_abi) for t in targets] == [
        ("3.10", False), ("3.11", False), ("3.12", True)
    ]  # fmt: skip
    assert skipped == [SkippedPython("3.13", SERVED)]
    assert cibuildwheel_selector(targets).split() == [
        "cp310-manylinux_x86_64", "cp311-manylinux_x86_64", "cp312-manylinux_x86_64"
    ]  # fmt: skip


def test_an_empty_cibuildwheel_selector_is_refused() -> None:
    with pytest.raises(BuildError, match=r"CIBW_BUILD"):
        cibuildwheel_selector([])


def _fake_cibuildwheel(names: list[str]) -> Callable[..., None]:
    def run(source_dir: Path, output_dir: Path, build: str, env: dict[str, str]) -> None:
        for name in names:
            with zipfile.ZipFile(output_dir / name, "w") as archive:
                archive.writestr("activekv/__init__.py", "")

    return run


def test_an_unplanned_cibuildwheel_wheel_leaves_the_wheels_folder_alone(
    manifest: Manifest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Negative control: the tag check ran after the staging folder had replaced out/wheels."""
    out = tmp_path / "out"
    (out / "wheels").mkdir(parents=True)
    (out / "wheels" / "previous.whl").write_text("kept")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    unplanned = "activekv-1.0-cp39-cp39-manylinux_2_28_x86_64.whl"
    monkeypatch.setattr(wheels, "run_cibuildwheel", _fake_cibuildwheel([unplanned]))
    targets, skipped = plan_container_targets(manifest, ["3.11"])
    with pytest.raises(BuildError, match=r"cp39-cp39.*no planned target asked for"):
        wheels._build_with_cibuildwheel(manifest, targets, skipped, tmp_path, out)
    assert sorted(p.name for p in (out / "wheels").iterdir()) == ["previous.whl"]


def test_planned_cibuildwheel_wheels_replace_the_wheels_folder(
    manifest: Manifest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    (out / "wheels").mkdir(parents=True)
    (out / "wheels" / "previous.whl").write_text("replaced")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    made = "activekv-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    monkeypatch.setattr(wheels, "run_cibuildwheel", _fake_cibuildwheel([made]))
    targets, skipped = plan_container_targets(manifest, ["3.11"])
    report = wheels._build_with_cibuildwheel(manifest, targets, skipped, tmp_path, out)
    assert [w.path for w in report.wheels] == [out / "wheels" / made]
    assert sorted(p.name for p in (out / "wheels").iterdir()) == [made]
