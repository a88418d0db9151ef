"""pyproject.toml is the single source of pinned versions; this reads its dependency groups."""

from __future__ import annotations

import sys

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
    return str(pyproject()["project"]["version"])


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
