"""Member names an installer could place elsewhere than they read: duplicates, a file that is
also a folder, spellings that a case-insensitive or normalising filesystem merges, invisible
characters, backslashes, absolute paths and ``.``/``..`` parts. The payload gate judges every
member of every wheel, and of the sdist, by these."""

from __future__ import annotations

import unicodedata

# Path parts an installer drops or resolves, so the member lands elsewhere than its name says.
_ODD_PARTS = {"": "an empty", ".": "a '.'", "..": "a '..'"}


# Characters a name may not hold: control and format characters (zero-width joiners and bidi
# overrides, which some filesystems ignore when they compare names and which make a name read
# as another), line and paragraph separators, private-use, surrogate and unassigned ones.
_UNPRINTABLE = {"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"}


def _filesystem_key(path: str) -> str:
    """What a case-insensitive or Unicode-normalising filesystem makes of a path."""
    return unicodedata.normalize("NFC", path).casefold()


def _folders_and_self(name: str) -> list[str]:
    """Every folder above `name` ("a/", "a/b/"), then `name` itself, shortest first."""
    parts = name.split("/")
    folders = ["/".join(parts[:end]) + "/" for end in range(1, len(parts))]
    return folders if name.endswith("/") else [*folders, name]


def path_spellings(names: list[str]) -> dict[str, set[str]]:
    """Every path the members' names make (folders ending in '/'), by what a case-insensitive
    or normalising filesystem makes of it without that '/'."""
    spellings: dict[str, set[str]] = {}
    for name in names:
        for path in _folders_and_self(name):
            spellings.setdefault(_filesystem_key(path.removesuffix("/")), set()).add(path)
    return spellings


def member_name_problem(
    name: str,
    count: int = 1,
    spellings: dict[str, set[str]] | None = None,
    archive: str = "wheel",
) -> str:
    """Why an installer (or pip unpacking an sdist) could put the member `name` somewhere other
    than where the gate judged it (`count`: how many members of the `archive` carry that name;
    `spellings`: every path of the archive by what a case-insensitive or normalising filesystem
    makes of it); empty when nothing."""
    if count > 1:
        return (
            f"the {archive} holds {count} members of this name; expected one (installers keep one)"
        )
    for path in _folders_and_self(name):
        same = (spellings or {}).get(_filesystem_key(path.removesuffix("/")), set())
        if len({spelled.endswith("/") for spelled in same}) > 1:
            return (
                f"{path.removesuffix('/')!r} is a file and a folder in the {archive}; expected one"
            )
        if len(ways := {spelled.removesuffix("/") for spelled in same}) > 1:
            return (
                f"{path.removesuffix('/')!r} is spelled {len(ways)} ways in the {archive} "
                f"({sorted(ways)}), which differ only in case or Unicode normalisation; expected "
                "one spelling (a case-insensitive or normalising filesystem keeps one)"
            )
    if odd := [char for char in name if unicodedata.category(char) in _UNPRINTABLE]:
        return (
            f"the name holds an invisible or control character (U+{ord(odd[0]):04X}); expected "
            "printable characters only"
        )
    if "\\" in name:
        return "the name holds a backslash; expected '/' between the parts of a path"
    if name.startswith("/"):
        return f"the name is absolute; expected a path relative to the {archive}'s root"
    parts = name.removesuffix("/").split("/")  # a folder's entry ends in one '/'
    if odd := [_ODD_PARTS[part] for part in parts if part in _ODD_PARTS]:
        return f"the name has {odd[0]} part; expected a path of plain parts (no empty, . or ..)"
    return ""
