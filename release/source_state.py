"""What the provenance says the wheels were built from: the checkout's commit, and whether
uncommitted changes reach a wheel (then their paths and one digest of them), so that a statement
never names HEAD for bytes HEAD does not hold. Stable refuses such a tree; dev records it.

The tree is compared with the commit through an index of its own, read from HEAD: flags set in
the checkout's index (``--assume-unchanged``, ``--skip-worktree``) and exclude files
(``.gitignore``, ``.git/info/exclude``) hide nothing from it; only byte-code caches are not
inputs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from release.errors import ReleaseError, SigningError
from release.records import BuiltFrom
from release.util.paths import SOURCE_ROOTS

# What reaches a wheel's bytes: its sources, the manifest, and the pipeline that builds them
# (release/ and the nox sessions that call it).
WHEEL_INPUTS = (*SOURCE_ROOTS, "manifests", "release", "noxfile.py")


@dataclass(frozen=True)
class SourceState:
    commit: str | None  # None outside a git checkout
    changed: tuple[str, ...] = ()  # uncommitted paths (modified, added, deleted, untracked)
    change_sha256: str | None = None  # of the diff to the commit and each untracked file

    @property
    def dirty(self) -> bool:
        return bool(self.changed)

    def annotations(self) -> dict[str, object]:
        """The statement's annotations of the source commit (SLSA ResourceDescriptor)."""
        if not self.dirty:
            return {}
        return {"dirty": True, "uncommittedChangesSha256": self.change_sha256,
                "uncommittedPaths": list(self.changed)}  # fmt: skip

    def record(self) -> BuiltFrom:
        """As the build record keeps it."""
        return BuiltFrom(commit=self.commit, uncommitted=self.changed,
                         uncommitted_sha256=self.change_sha256)  # fmt: skip

    @classmethod
    def of_record(cls, built: BuiltFrom) -> SourceState:
        return cls(built.commit, built.uncommitted, built.uncommitted_sha256)

    def describe(self) -> str:
        if self.commit is None:
            return "no git commit"
        if not self.dirty:
            return f"commit {self.commit}, no uncommitted change"
        return (f"commit {self.commit} with {len(self.changed)} uncommitted change(s) "
                f"(sha256 {self.change_sha256})")  # fmt: skip


def _git(source_dir: Path, *arguments: str, index: Path | None = None) -> bytes:
    env = os.environ if index is None else {**os.environ, "GIT_INDEX_FILE": str(index)}
    done = subprocess.run(["git", "-C", str(source_dir), *arguments], capture_output=True, env=env)
    if done.returncode != 0:
        raise ReleaseError(f"{source_dir}: git {arguments[0]} failed: "
                           f"{done.stderr.decode(errors='replace').strip()}")  # fmt: skip
    return done.stdout


def _names(output: bytes) -> list[str]:
    return [n for n in output.decode("utf-8", "surrogateescape").split("\0") if n]


def _is_bytecode(name: str) -> bool:
    return "__pycache__" in name.split("/") or name.endswith((".pyc", ".pyo"))


def source_state(source_dir: Path) -> SourceState:
    """The commit of ``source_dir`` and its uncommitted changes under WHEEL_INPUTS."""
    head = subprocess.run(["git", "-C", str(source_dir), "rev-parse", "--verify", "-q", "HEAD"],
                          capture_output=True)  # fmt: skip
    if head.returncode != 0:
        return SourceState(None)
    commit = head.stdout.decode().strip()
    with tempfile.TemporaryDirectory(prefix="activekv-source-") as scratch:
        index = Path(scratch) / "index"
        _git(source_dir, "read-tree", commit, index=index)
        # Tracked files whose bytes differ from the commit's, or that are gone.
        modified = _names(_git(source_dir, "diff", "--name-only", "-z", "--no-renames", commit,
                               "--", *WHEEL_INPUTS, index=index))  # fmt: skip
        diff = _git(source_dir, "diff", "--binary", "--no-renames", commit, "--", *WHEEL_INPUTS,
                    index=index)  # fmt: skip
        # Every file the commit lacks, ignored or not: no exclude rule is applied.
        untracked = sorted(n for n in _names(_git(source_dir, "ls-files", "-z", "--others", "--",
                                                  *WHEEL_INPUTS, index=index))
                           if not _is_bytecode(n))  # fmt: skip
    changed = tuple(sorted({*modified, *untracked}))
    if not changed:
        return SourceState(commit)
    digest = hashlib.sha256(diff)
    for name in untracked:
        digest.update(b"\0untracked\0" + name.encode("utf-8", "surrogateescape") + b"\0")
        digest.update(hashlib.sha256((source_dir / name).read_bytes()).digest())
    return SourceState(commit, changed, digest.hexdigest())


def refuse_dirty(state: SourceState, channel: str, source_dir: Path) -> None:
    """SigningError when uncommitted changes reach the wheels of ``channel``, which signs only
    what a commit holds."""
    if state.dirty:
        shown = ", ".join(state.changed[:5]) + (" …" if len(state.changed) > 5 else "")
        raise SigningError(
            f"{source_dir}: expected a checkout whose wheel inputs are committed to release on "
            f"{channel!r} (its provenance names the commit the wheels are built from); got "
            f"{len(state.changed)} uncommitted path(s): {shown}. Commit or stash them"
        )


def checked_built_from(
    recorded: BuiltFrom | None, source_dir: Path, record_path: Path
) -> SourceState:
    """The tree the wheels were built from, as their build record says, if the checkout still
    is that tree; else SigningError: a statement names the tree the build read, never one
    changed since (its commit would not hold the wheels' bytes)."""
    now = source_state(source_dir)
    if recorded is None:
        raise SigningError(f"{record_path}: source: expected the tree the wheels were built from; "
                           "got none (a record of an older build): run `python -m release build` "
                           "again")  # fmt: skip
    built = SourceState.of_record(recorded)
    if built != now:
        raise SigningError(f"{record_path}: source: expected the checkout to be the tree the "
                           f"wheels were built from ({built.describe()}); got {now.describe()}: "
                           "it changed since the build. Build again from this tree, or sign from "
                           "the one they were built from")  # fmt: skip
    return built
