"""This checkout's sources committed in a new repository, dated at the checkout's
SOURCE_DATE_EPOCH: the same sources, epoch and toolchain are the wheel cache's key, so a build of
the commit is the checkout's own cached wheel and compiles nothing (test_release_e2e,
test_rebuild's publishers)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from release.builder.reproduce import snapshot
from release.builder.wheels import source_date_epoch

REPO = Path(__file__).resolve().parent.parent


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> None:
    identity = ["-c", "user.name=activekv tests", "-c", "user.email=tests@localhost"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "-C", str(repo), *identity, *args], check=True, capture_output=True,
                   env={**clean, **(env or {})})  # fmt: skip


def dated_commit(repo: Path, message: str) -> None:
    """Commits what is staged in `repo`, dated at the checkout's SOURCE_DATE_EPOCH."""
    date = f"@{source_date_epoch(REPO)}"
    _git(repo, "commit", "--quiet", "--message", message,
         env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})  # fmt: skip


def committed_snapshot(
    destination: Path, message: str, edit: Callable[[Path], None] | None = None
) -> Path:
    """The checkout's files (tracked and untracked, as a build reads them) in `destination`,
    changed by `edit` if given, committed as one dated commit."""
    repo = snapshot(REPO, destination)
    if edit is not None:
        edit(repo)
    _git(repo, "init", "--quiet")
    _git(repo, "add", "--all")
    dated_commit(repo, message)
    return repo
