"""The sdist build (release/builder/sdist.py): `python -m build --sdist` with the build's
SOURCE_DATE_EPOCH makes byte-identical sdists from two copies of the checkout at other paths,
with other file times and modes; another epoch makes another archive, and the differences are
named member by member. The sdist replaces `<out>/sdist/` only when the block it is staged for
succeeds; scikit-build-core settings in the environment do not change it; a frontend or backend
other than the pinned ones is refused in one line."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from release.builder import sdist as sdist_build
from release.builder.reproduce import snapshot
from release.builder.sdist import StagedSdist, sdist_differences
from release.errors import BuildError
from release.util.paths import REPO_ROOT

pytestmark = pytest.mark.integration  # runs PyPA's build frontend eight times (~7 s)

EPOCH = 1_700_000_000


def _build(source: Path, out: Path, epoch: int = EPOCH) -> Path:
    with StagedSdist(source, out, epoch) as staged:
        pass
    return staged.built.path


def _disturb(tree: Path) -> None:
    """Other times and modes than the checkout's: what another clone, umask or clock gives."""
    for path in tree.rglob("*"):
        if path.is_file():
            os.utime(path, (EPOCH + 12345, EPOCH + 12345))
            path.chmod(path.stat().st_mode | stat.S_IWGRP | stat.S_IWOTH)


def test_two_builds_from_two_copies_are_identical(tmp_path: Path) -> None:
    first = snapshot(REPO_ROOT, tmp_path / "a" / "activekv")
    second = snapshot(REPO_ROOT, tmp_path / "b" / "elsewhere" / "src-of-activekv")
    _disturb(second)
    one, two = _build(first, tmp_path / "out-a"), _build(second, tmp_path / "out-b")
    assert one.name == two.name == "activekv-0.1.0.tar.gz"
    assert one.read_bytes() == two.read_bytes(), sdist_differences(one, two)
    with tarfile.open(one, "r:gz") as archive:
        members = archive.getmembers()
    assert {m.mtime for m in members} == {EPOCH}  # every member stamped with SOURCE_DATE_EPOCH
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
    assert {m.mode for m in members} <= {0o644, 0o755}


def test_another_epoch_is_another_archive_and_each_member_is_named(tmp_path: Path) -> None:
    one = _build(REPO_ROOT, tmp_path / "out-a")
    two = _build(REPO_ROOT, tmp_path / "out-b", EPOCH + 1)
    assert one.read_bytes() != two.read_bytes()
    found = sdist_differences(one, two)
    assert f"activekv-0.1.0/pyproject.toml: mtime {EPOCH} and {EPOCH + 1}" in found


def test_the_sdist_changes_only_with_the_block_it_is_staged_for(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kept = _build(REPO_ROOT, out)
    before = kept.read_bytes()
    with pytest.raises(RuntimeError), StagedSdist(REPO_ROOT, out, EPOCH + 1):
        raise RuntimeError("a wheel build failed")
    assert kept.read_bytes() == before  # the earlier sdist, as it was
    assert sorted(p.name for p in out.iterdir()) == ["logs", "sdist"]  # no staging left


def test_scikit_build_settings_in_the_environment_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _build(REPO_ROOT, tmp_path / "plain")
    monkeypatch.setenv("SKBUILD_SDIST_EXCLUDE", "/release")  # would drop the pipeline
    assert _build(REPO_ROOT, tmp_path / "env").read_bytes() == plain.read_bytes()


def test_another_backend_than_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdist_build, "backend_pin", lambda: "0.0.1")
    with pytest.raises(BuildError) as refused:
        _build(REPO_ROOT, tmp_path / "out")
    message = str(refused.value)
    assert message.startswith("the sdist: expected build and scikit-build-core==0.0.1 (build-")
    assert (
        "scikit-build-core 1.1.2" in message
        and "install pyproject's build dependency group" in (message)
    )
    assert not (tmp_path / "out" / "sdist").exists()


def test_the_groups_the_release_installs_hold_the_sdists_frontend_and_pinned_backend() -> None:
    """`nox -s release` and the workflow's release job install the build and release groups
    only, and the sdist is built there without isolation: those groups must pin PyPA's build
    and scikit-build-core at build-system.requires' version (a fresh clone failed here once)."""
    import ast

    from packaging.requirements import Requirement

    from release.util.pins import pyproject

    noxfile = ast.parse((REPO_ROOT / "noxfile.py").read_text())
    (release,) = [n for n in noxfile.body if isinstance(n, ast.FunctionDef) and n.name == "release"]
    first = next(
        node
        for node in ast.walk(release)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_install"
    )
    groups = {arg.value for arg in first.args if isinstance(arg, ast.Constant)}
    assert groups == {"build", "release"}
    pinned = {
        Requirement(text).name: str(Requirement(text).specifier)
        for group in sorted(groups)
        for text in pyproject()["dependency-groups"][group]
        if isinstance(text, str)
    }
    assert pinned.get(sdist_build.FRONTEND, "").startswith("==")
    assert pinned.get(sdist_build.BACKEND) == f"=={sdist_build.backend_pin()}"
