"""Where two wheels differ, member by member: the reproducible gate compares two builds with it,
and a rebuild compares its wheel with the published one."""

from __future__ import annotations

import zipfile
from pathlib import Path


def wheel_differences(first: Path, second: Path) -> list[str]:
    """Each member that differs between two wheels, with its first differing byte offset."""
    with zipfile.ZipFile(first) as a, zipfile.ZipFile(second) as b:
        names_a, names_b = set(a.namelist()), set(b.namelist())
        found = [f"{name}: only in the first build" for name in sorted(names_a - names_b)]
        found += [f"{name}: only in the second build" for name in sorted(names_b - names_a)]
        for name in sorted(names_a & names_b):
            data_a, data_b = a.read(name), b.read(name)
            if data_a != data_b:
                offset = next(
                    (i for i, (x, y) in enumerate(zip(data_a, data_b, strict=False)) if x != y),
                    min(len(data_a), len(data_b)),
                )
                found.append(
                    f"{name}: first difference at byte {offset} "
                    f"({len(data_a)} and {len(data_b)} bytes)"
                )
        if not found:
            found.append("same members and bytes; the archive itself differs (order, times)")
    return found
