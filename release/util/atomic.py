"""Writing a file so that a reader sees the old bytes or the new ones, never a part."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from release.errors import WriteError


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Writes `data` to a temporary file beside `path`, flushes it to disk, then renames it over
    `path`; on any failure the temporary file is removed and `path` is unchanged. A write the
    system refuses (no space left, no permission, ...) is a WriteError naming `path` and why."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as error:
        _remove(tmp)
        raise WriteError(f"writing {path}: {error.strerror or error}") from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: str | None) -> None:
    """The temporary file, gone (the write's own error says more than a failed removal)."""
    if tmp is not None:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)
