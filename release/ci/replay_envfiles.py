"""The files a step writes to talk to the runner, read as Actions reads them after each step.

* ``$GITHUB_ENV``: ``NAME=value`` lines, or ``NAME<<DELIMITER`` then the value's lines then the
  delimiter alone; each becomes a variable of every later step of the job;
* ``$GITHUB_OUTPUT``: the same syntax; each becomes ``steps.<id>.outputs.<name>``;
* ``$GITHUB_PATH``: one folder per line, put before ``PATH`` for every later step (a later line
  comes first, as each is prepended in turn).

A malformed line is an :class:`EnvFileError` naming the file and the line's number, never its
value (it may hold a secret).
"""

from __future__ import annotations

import re
from pathlib import Path

from release.errors import ReleaseError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables the runner refuses to take from a step (they would change how it runs the rest).
_REFUSED = frozenset({"NODE_OPTIONS"})


class EnvFileError(ReleaseError):
    """A line of an environment file the runner would refuse."""


def parse_assignments(text: str, origin: str, *, comments: bool = False) -> dict[str, str]:
    """``NAME=value`` and ``NAME<<DELIMITER`` blocks, in order (a later one wins); with
    ``comments``, a line starting with ``#`` outside a block is skipped."""
    values: dict[str, str] = {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    index = 0
    while index < len(lines):
        line = lines[index].removesuffix("\r")
        number = index + 1
        index += 1
        if not line.strip() or (comments and line.lstrip().startswith("#")):
            continue
        heredoc = re.fullmatch(r"([^=<]+)<<(.+)", line)  # a name holds no "=": "<<" comes first
        if heredoc:
            name, delimiter = heredoc.group(1), heredoc.group(2)
            body: list[str] = []
            while index < len(lines) and lines[index].removesuffix("\r") != delimiter:
                body.append(lines[index].removesuffix("\r"))
                index += 1
            if index == len(lines):
                raise EnvFileError(
                    f"{origin}:{number}: expected the delimiter that ends "
                    f"{name}'s value alone on a line; got the end of the file"
                )
            index += 1
            values[_checked(name, origin, number)] = "\n".join(body)
            continue
        name, equals, value = line.partition("=")
        if not equals:
            raise EnvFileError(
                f"{origin}:{number}: expected NAME=value or NAME<<DELIMITER; got a line without '='"
            )
        values[_checked(name, origin, number)] = value
    return values


def _checked(name: str, origin: str, number: int) -> str:
    if not _NAME.fullmatch(name):
        # The line is not echoed: a secrets file's line may hold a value.
        raise EnvFileError(
            f"{origin}:{number}: expected a variable name (letters, digits and _, "
            "not starting with a digit) before '=' or '<<'; got other characters"
        )
    if name.upper() in _REFUSED:
        raise EnvFileError(f"{origin}:{number}: {name} may not be set from a step")
    return name


def read_assignments(path: Path) -> dict[str, str]:
    """What a step wrote to ``path`` (nothing when it wrote nothing)."""
    if not path.exists():
        return {}
    return parse_assignments(path.read_text(), str(path))


def read_path_entries(path: Path) -> list[str]:
    """The folders a step added to ``$GITHUB_PATH``, in the order they go before PATH."""
    if not path.exists():
        return []
    entries = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return list(reversed(entries))
