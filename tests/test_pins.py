"""pyproject.toml pins every tool exactly, once: a pin that appears twice has one version."""

from __future__ import annotations

import re

from packaging.requirements import Requirement

from release.util.pins import dependency_group, pyproject

GROUPS = ("nox", "build", "cuda-compiler", "release", "test")


def _pins() -> list[Requirement]:
    requirements = [Requirement(r) for r in pyproject()["build-system"]["requires"]]
    for group in GROUPS:
        requirements += [Requirement(r) for r in dependency_group(group)]
    return requirements


def test_every_requirement_is_pinned_exactly():
    loose = [str(r) for r in _pins() if not re.fullmatch(r"==[\w.]+", str(r.specifier))]
    assert loose == []


def test_a_tool_pinned_in_two_places_has_one_version():
    versions: dict[str, set[str]] = {}
    for requirement in _pins():
        versions.setdefault(requirement.name.lower(), set()).add(str(requirement.specifier))
    assert {name: v for name, v in versions.items() if len(v) > 1} == {}


def test_the_declared_groups_exist():
    for group in GROUPS:
        assert dependency_group(group)
