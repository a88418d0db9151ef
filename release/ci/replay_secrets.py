"""The repository's secrets for a replay: a file the operator passes in (``--secrets FILE``), and
the mask that keeps every value out of what the replay prints and logs.

The file holds ``NAME=value`` lines, and ``NAME<<DELIMITER`` blocks for a value of several lines
(a PEM key), as ``$GITHUB_ENV`` does; blank lines and ``#`` comments are skipped. It is refused
when group or others may read it (as a signing key is), and a bad line is named by its number,
never by its value.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from release.ci.replay_envfiles import EnvFileError, parse_assignments
from release.errors import ReleaseError

MASK = "***"
# A secret line this short would mask ordinary words; GitHub masks such values too, but a
# replay's reader needs its log legible, and a 1-3 character secret protects nothing.
_SHORTEST_MASKED = 4


class SecretsError(ReleaseError):
    """The secrets file cannot be used; the message names it and the line, never a value."""


def read_secrets(path: Path) -> dict[str, str]:
    """The secrets in ``path`` (SecretsError when others may read it or a line is bad)."""
    try:
        info = path.stat()
    except OSError as error:
        raise SecretsError(
            f"--secrets {path}: expected a readable file; got {error.strerror or error}"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise SecretsError(f"--secrets {path}: expected a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise SecretsError(
            f"--secrets {path}: has mode {mode:04o}; it must be readable by its "
            f"owner only, as a signing key is: chmod 600 {path}"
        )
    try:
        return parse_assignments(path.read_text(), f"--secrets {path}", comments=True)
    except EnvFileError as error:
        raise SecretsError(str(error)) from None


class Masker:
    """Replaces every secret value (and each line of a value of several lines) with ***."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(values)

    def add(self, values: Iterable[str]) -> None:
        for value in values:
            for part in (value, *value.splitlines()):
                part = part.strip()
                if len(part) >= _SHORTEST_MASKED:
                    self._values.add(part)
        ordered = sorted(self._values, key=len, reverse=True)  # the longest first
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        return self._pattern.sub(MASK, text) if self._pattern else text


def masker_for(secrets: Mapping[str, str]) -> Masker:
    return Masker(secrets.values())
