"""Honest provenance (release/source_state.py): a statement names a commit only for the
bytes that commit holds. Uncommitted changes to wheel inputs are recorded (dev) with their digest,
and refused on stable before anything is signed; changes elsewhere (tests) are not wheel inputs."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from fixtures_wheels import build_wheel

from release import records
from release.cli import main
from release.context import Context
from release.errors import SigningError
from release.manifest import load_manifest
from release.records import BuildRecord, SignRecord
from release.report.document import built_from
from release.source_state import checked_built_from, refuse_dirty, source_state
from release.trust.sign import build_statement
from release.trust.steps import step_sign
from release.util.paths import DEFAULT_MANIFEST


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    for name in (
        "engine/offload/engine.cpp",
        "tests/test_x.py",
        "DESCRIPTION.md",
        "README.md",
        "release/steps.py",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"{name}\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    return root


def test_a_clean_checkout_names_its_commit_and_nothing_else(repo):
    state = source_state(repo)
    assert state.commit is not None and len(state.commit) == 40
    assert not state.dirty and state.annotations() == {}
    refuse_dirty(state, "stable", repo)


def test_changes_outside_the_wheel_inputs_leave_the_tree_clean(repo):
    (repo / "tests" / "test_x.py").write_text("changed\n")
    (repo / "tests" / "new.py").write_text("new\n")
    (repo / "README.md").write_text("lab notes\n")  # not the long description (DESCRIPTION.md)
    (repo / "docs").mkdir()
    (repo / "docs" / "engine.md").write_text("new\n")
    assert not source_state(repo).dirty


@pytest.mark.parametrize(
    "change",
    [
        "modify",
        "untracked",
        "delete",
        "staged",
        "assume-unchanged",
        "skip-worktree",
        "ignored",
        "excluded",
    ],
)
def test_every_kind_of_uncommitted_change_to_a_wheel_input_is_seen(repo, change):
    source = repo / "engine" / "offload" / "engine.cpp"
    if change == "modify":
        source.write_text("changed\n")
    elif change == "untracked":
        (repo / "engine" / "offload" / "extra.h").write_text("new\n")
    elif change == "delete":
        source.unlink()
    elif change == "staged":
        source.write_text("staged\n")
        _git(repo, "add", "engine/offload/engine.cpp")
    elif change in ("assume-unchanged", "skip-worktree"):  # flags that hide it from git status
        _git(repo, "update-index", f"--{change}", "engine/offload/engine.cpp")
        source.write_text("hidden\n")
    elif change == "ignored":  # an ignore rule does not keep a file out of the build
        (repo / ".gitignore").write_text("*.h\n")
        _git(repo, "add", ".gitignore")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "ignore")
        (repo / "engine" / "offload" / "ignored.h").write_text("#define X 1\n")
    else:
        (repo / ".git" / "info").mkdir(exist_ok=True)
        (repo / ".git" / "info" / "exclude").write_text("engine/\n")
        (repo / "engine" / "offload" / "excluded.h").write_text("#define X 1\n")
    state = source_state(repo)
    assert state.dirty and state.change_sha256 and len(state.change_sha256) == 64
    assert any(path.startswith("engine/offload/") for path in state.changed)
    refused = r"inputs are committed to release on 'stable'.*uncommitted path\(s\): engine/offload/"
    with pytest.raises(SigningError, match=refused):
        refuse_dirty(state, "stable", repo)


def test_the_build_code_is_a_wheel_input_and_byte_code_is_not(repo):
    (repo / "release" / "__pycache__").mkdir(parents=True)
    (repo / "release" / "__pycache__" / "steps.cpython-311.pyc").write_bytes(b"\0")
    assert not source_state(repo).dirty
    (repo / "release" / "steps.py").write_text("changed = True\n")
    assert source_state(repo).changed == ("release/steps.py",)


def test_a_tree_changed_after_its_build_is_not_signed_as_its_source(repo, tmp_path):
    record = tmp_path / "out" / "build.json"
    source = repo / "engine" / "offload" / "engine.cpp"
    source.write_text("built from this\n")
    built = source_state(repo).record()  # as `build` recorded it
    assert checked_built_from(built, repo, record) == source_state(repo)
    source.write_text("engine/offload/engine.cpp\n")  # reverted: clean now, not what was built
    with pytest.raises(
        SigningError,
        match=r"build\.json: source: expected the checkout to be the "
        r"tree the wheels were built from \(commit [0-9a-f]{40} with 1 uncommitted"
        r".*got commit [0-9a-f]{40}, no uncommitted change: it changed since",
    ):
        checked_built_from(built, repo, record)
    with pytest.raises(
        SigningError,
        match=r"build\.json: source: expected the tree the wheels "
        r"were built from; got none",
    ):
        checked_built_from(None, repo, record)


def test_the_digest_is_of_the_change_itself(repo):
    source = repo / "engine" / "offload" / "engine.cpp"
    source.write_text("one\n")
    first = source_state(repo).change_sha256
    assert source_state(repo).change_sha256 == first
    source.write_text("two\n")
    assert source_state(repo).change_sha256 != first
    source.write_text("engine/offload/engine.cpp\n")  # back to the commit's bytes
    assert not source_state(repo).dirty
    (repo / "DESCRIPTION.md").write_text("x\n")
    readme = source_state(repo).change_sha256
    (repo / "DESCRIPTION.md").write_text("DESCRIPTION.md\n")
    (repo / "engine" / "new.txt").write_text("x\n")  # untracked: its contents count
    untracked = source_state(repo).change_sha256
    (repo / "engine" / "new.txt").write_text("y\n")
    assert len({readme, untracked, source_state(repo).change_sha256}) == 3


def test_the_statement_and_the_record_say_the_tree_was_dirty(repo, tmp_path):
    (repo / "engine" / "offload" / "engine.cpp").write_text("changed\n")
    state = source_state(repo)
    now = datetime.now(timezone.utc)
    statement = build_statement(
        [build_wheel(tmp_path / "dist")], version="0.1.0", channel="dev",
        manifest_path=DEFAULT_MANIFEST, manifest_sha256="0" * 64, source_commit=state.commit,
        source_annotations=state.annotations(), source_date_epoch=1, toolchain={}, started=now,
        finished=now,
    )  # fmt: skip
    (source,) = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert source["digest"] == {"gitCommit": state.commit}
    assert source["annotations"] == {"dirty": True, "uncommittedChangesSha256": state.change_sha256,
                                     "uncommittedPaths": ["engine/offload/engine.cpp"]}  # fmt: skip
    record = SignRecord(channel="dev", envelope="e", envelope_sha256="0" * 64, keyid="k",
                        public_key="p", subjects={}, source_commit=state.commit,
                        uncommitted=state.changed,
                        uncommitted_sha256=state.change_sha256)  # fmt: skip
    said = built_from(record)
    assert f"commit {state.commit} WITH 1 uncommitted change(s)" in said
    assert state.change_sha256 in said and "engine/offload/engine.cpp" in said
    clean = record.model_copy(update={"uncommitted": (), "uncommitted_sha256": None})
    assert "no uncommitted change" in built_from(clean)


def test_stable_refuses_to_sign_a_dirty_tree_before_anything_is_written(repo, tmp_path):
    manifest = tmp_path / "manifests" / DEFAULT_MANIFEST.name
    shutil.copytree(DEFAULT_MANIFEST.parent, manifest.parent)
    keys = tmp_path / "keys"
    assert main(["keygen", "--manifest", str(manifest), "--channel", "stable", str(keys),
                 "--pin"]) == 0  # fmt: skip
    (repo / "engine" / "offload" / "engine.cpp").write_text("changed\n")
    out = tmp_path / "out"
    now = datetime.now(timezone.utc)
    records.write(out, BuildRecord(started=now, finished=now, source_date_epoch=1, toolchain={},
                                   wheels=(), source=source_state(repo).record()))  # fmt: skip
    context = Context(load_manifest(manifest), repo, out, tmp_path / "state", key_dir=keys)
    with pytest.raises(SigningError, match=r"uncommitted path\(s\): engine/offload/engine\.cpp"):
        step_sign(context, "stable")
    assert [p.name for p in out.iterdir()] == ["build.json"]
