"""pyproject.toml is the single source of pinned versions; this reads its dependency groups."""

from __future__ import annotations

import sys

from packaging.version import InvalidVersion, Version

from release.errors import ReleaseError
from release.util.paths import PYPROJECT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def pyproject() -> dict:
    with PYPROJECT.open("rb") as stream:
        return tomllib.load(stream)


def project_version() -> str:
    """[project].version, checked to be a PEP 440 version in its normal form: it is used in file
    names (the statement, the index's folders), so nothing else may get through."""
    raw = pyproject().get("project", {}).get("version")
    try:
        normal = str(Version(raw)) if isinstance(raw, str) else None
    except InvalidVersion:
        normal = None
    if normal is None or normal != raw:
        hint = f" (its normal form is {normal!r})" if normal else ""
        raise ReleaseError(f"{PYPROJECT}: project.version: expected a PEP 440 version in normal "
                           f"form such as '0.1.0'{hint}; got {raw!r}")  # fmt: skip
    return normal


def dependency_group(name: str) -> list[str]:
    """The requirement strings of one group, with included groups expanded."""
    groups = pyproject().get("dependency-groups", {})
    if name not in groups:
        raise ReleaseError(f"{PYPROJECT}: dependency-groups.{name}: expected a declared group")
    requirements: list[str] = []
    for entry in groups[name]:
        if isinstance(entry, dict):
            requirements += dependency_group(entry["include-group"])
        else:
            requirements.append(entry)
    return requirements


def pinned_version(group: str, name: str) -> str | None:
    """The exact version `name==X` pins in a dependency group, or None."""
    from packaging.requirements import Requirement

    for requirement in map(Requirement, dependency_group(group)):
        if requirement.name == name and str(requirement.specifier).startswith("=="):
            return str(requirement.specifier)[2:]
    return None
