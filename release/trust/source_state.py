"""What the provenance says the wheels were built from: the checkout's commit, and whether
uncommitted changes reach a wheel (then their paths and one digest of them), so that a statement
never names HEAD for bytes HEAD does not hold. Stable refuses such a tree; dev records it."""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from release.errors import SigningError
from release.util.paths import SOURCE_ROOTS

# What reaches a wheel's bytes: its sources, and the manifest and build code that shape them.
WHEEL_INPUTS = (*SOURCE_ROOTS, "manifests", "release/build")


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


def _git(source_dir: Path, *arguments: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(source_dir), *arguments], capture_output=True)


def source_state(source_dir: Path) -> SourceState:
    """The commit of ``source_dir`` and its uncommitted changes under WHEEL_INPUTS."""
    head = _git(source_dir, "rev-parse", "--verify", "HEAD")
    if head.returncode != 0:
        return SourceState(None)
    commit = head.stdout.decode().strip()
    status = _git(source_dir, "status", "--porcelain=v1", "-z", "--untracked-files=all",
                  "--no-renames", "--", *WHEEL_INPUTS)  # fmt: skip
    if status.returncode != 0:
        raise SigningError(f"{source_dir}: git status failed: "
                           f"{status.stderr.decode(errors='replace').strip()}")  # fmt: skip
    entries = [e for e in status.stdout.decode("utf-8", "surrogateescape").split("\0") if e]
    if not entries:
        return SourceState(commit)
    changed = tuple(sorted(entry[3:] for entry in entries))
    untracked = sorted(entry[3:] for entry in entries if entry.startswith("??"))
    digest = hashlib.sha256(_git(source_dir, "diff", "--binary", "HEAD", "--",
                                 *WHEEL_INPUTS).stdout)  # fmt: skip
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
