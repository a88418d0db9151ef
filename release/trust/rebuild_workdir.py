"""The rebuild's work folder (`<out>/rebuild`): emptied before each rebuild, so it must hold
nothing else of the consumer's. A folder is removed only when this command made it (it carries a
mark) or it is empty, and `--source` and the TUF cache must lie apart from it."""

from __future__ import annotations

import shutil
from pathlib import Path

from release.errors import VerifyError

# Written into the work folder when it is made: only a folder holding it is ever removed.
_WORKDIR_MARK = ".activekv-rebuild"


def check_workdir(workdir: Path) -> None:
    """VerifyError unless the work folder is a folder or can be made one: it and each folder above
    it that exists must be a folder."""
    for path in (workdir, *workdir.parents):
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise VerifyError(
                    f"--out: expected {path} to be a folder (it holds the rebuild's "
                    f"work folder {workdir}); it is a file"
                )
            return


def check_apart(path: Path, flag: str, workdir: Path) -> None:
    """VerifyError when `path` is the work folder, lies in it or holds it: the work folder is
    emptied before each rebuild."""
    given, work = path.resolve(), workdir.resolve()
    if given.is_relative_to(work) or work.is_relative_to(given):
        raise VerifyError(
            f"{flag} {path}: expected a folder apart from the rebuild's work folder "
            f"{workdir} (under --out), which is emptied before each rebuild; "
            "choose another --out"
        )


def _local_folder(source: str) -> Path | None:
    """The folder `--source` names on this machine (a path or a file:// URL); None for a URL."""
    if "://" in source and not source.startswith("file://"):
        return None
    path = Path(source.removeprefix("file://"))
    return path if path.exists() else None


def git_source(source: str, workdir: Path) -> str:
    """`--source` as git is given it: a local folder as an absolute path (git runs in the work
    folder), which must not be the work folder or lie in it. A folder holding the work folder
    (`--source .` with the default --out) is fine: only the work folder is emptied, and only when
    it carries the mark (fresh_workdir)."""
    local = _local_folder(source)
    if local is None:
        return source
    if local.resolve().is_relative_to(workdir.resolve()):
        raise VerifyError(
            f"--source {source}: expected a git repository outside the rebuild's work folder "
            f"{workdir} (under --out), which is emptied before each rebuild; choose another --out"
        )
    return str(local.resolve())


def fresh_workdir(workdir: Path) -> None:
    """An empty work folder, marked as this command's. An existing one is removed only when it is
    empty or carries the mark: a folder of someone else's at that path is never deleted."""
    if workdir.is_dir() and not workdir.is_symlink():
        if any(workdir.iterdir()) and not (workdir / _WORKDIR_MARK).is_file():
            raise VerifyError(
                f"--out: {workdir} is a folder this command did not make (no "
                f"{_WORKDIR_MARK} in it); expected none there, or the work folder "
                "of an earlier rebuild: move it away or choose another --out"
            )
        shutil.rmtree(workdir)
    elif workdir.is_symlink():
        raise VerifyError(
            f"--out: {workdir} is a symbolic link; expected the rebuild's own "
            "work folder there, or nothing"
        )
    try:
        workdir.mkdir(parents=True)
        (workdir / _WORKDIR_MARK).write_text("the work folder of `python -m release rebuild`\n")
    except OSError as error:
        raise VerifyError(
            f"--out: cannot make the work folder {workdir} ({error.strerror or error})"
        ) from None
