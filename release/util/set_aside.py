"""An earlier run's outputs, moved aside (never deleted) while a new run makes its own: put back
when the new run ends before it has made any, removed once it has.

The outputs are renamed into ``<folder>/.set-aside-<random>/`` (one filesystem: each rename is
atomic). A run killed meanwhile leaves that folder behind; the next :class:`SetAside` of the same
folder puts its entries back first (where nothing took their place), so no output is ever lost to
a kill. Removing the outputs once the new ones stand renames the folder to ``.discarded-…`` first:
a kill during that removal leaves nothing that would be put back over the new outputs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

ASIDE_PREFIX = ".set-aside-"
DISCARDED_PREFIX = ".discarded-"


class SetAside:
    """``with SetAside(folder, names) as aside:`` moves each of ``names`` under ``folder`` aside;
    :meth:`discard` removes them for good once the new outputs stand; leaving the block without
    :meth:`discard` (a failure) puts them back, replacing whatever the run left in their place."""

    def __init__(self, folder: Path, names: Sequence[str]) -> None:
        self.folder = folder
        self.names = tuple(names)
        self._aside: Path | None = None
        self._moved: list[str] = []

    def __enter__(self) -> SetAside:
        restore_leftovers(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._aside = Path(tempfile.mkdtemp(dir=self.folder, prefix=ASIDE_PREFIX))
        try:
            for name in self.names:
                if _exists(self.folder / name):
                    os.rename(self.folder / name, self._aside / name)
                    self._moved.append(name)
        except BaseException:
            self._put_back()
            raise
        return self

    def discard(self) -> None:
        """The new run's outputs stand: the earlier ones go."""
        if self._aside is None:
            return
        discarded = self._aside.with_name(DISCARDED_PREFIX + self._aside.name[len(ASIDE_PREFIX) :])
        os.rename(self._aside, discarded)
        self._aside = None
        shutil.rmtree(discarded, ignore_errors=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._put_back()

    def _put_back(self) -> None:
        if self._aside is None:
            return
        for name in self._moved:
            _remove(self.folder / name)  # what the failed run left there
            os.rename(self._aside / name, self.folder / name)
        self._aside.rmdir()
        self._aside = None


def restore_leftovers(folder: Path) -> None:
    """What a killed run set aside under ``folder``, put back where nothing took its place; what
    it was discarding, removed."""
    if not folder.is_dir():
        return
    for leftover in sorted(folder.glob(DISCARDED_PREFIX + "*")):
        shutil.rmtree(leftover, ignore_errors=True)
    for leftover in sorted(folder.glob(ASIDE_PREFIX + "*")):
        for entry in sorted(leftover.iterdir()):
            if not _exists(folder / entry.name):
                os.rename(entry, folder / entry.name)
        shutil.rmtree(leftover)


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif _exists(path):
        path.unlink()
