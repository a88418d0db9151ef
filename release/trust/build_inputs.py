"""What a signed build statement says the wheel was built from, as the rebuild takes it: the one
source commit, SOURCE_DATE_EPOCH and the toolchain record. Every field read is checked, and a
malformed one is a VerifyError naming it (a statement is signed, not necessarily well formed)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from release.errors import VerifyError
from release.records import LATEST_EPOCH


def _statement_error(field: str, expected: str, got: object) -> VerifyError:
    return VerifyError(f"the signed statement's {field}: expected {expected}; got {got!r}")


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _statement_error(field, "an object", value)
    return value


def _refuse_uncommitted(dependency: Mapping[str, Any], commit: object) -> None:
    """A statement that says its wheels had uncommitted changes names no commit to rebuild."""
    annotations = dependency.get("annotations")
    if isinstance(annotations, Mapping) and annotations.get("dirty") is True:
        raise VerifyError(
            f"the signed statement says its wheels were built from commit {commit} with "
            f"uncommitted changes (sha256 {annotations.get('uncommittedChangesSha256')}); no "
            "commit holds those sources, so there is nothing to rebuild from"
        )


def _commit(definition: Mapping[str, Any]) -> str:
    """The one gitCommit among the resolved dependencies, a commit id."""
    field = "predicate.buildDefinition.resolvedDependencies"
    dependencies = definition.get("resolvedDependencies", [])
    if not isinstance(dependencies, list):
        raise _statement_error(field, "a list of resource descriptors", dependencies)
    commits = []
    for number, dependency in enumerate(dependencies):
        digest = _mapping(
            _mapping(dependency, f"{field}[{number}]").get("digest", {}),
            f"{field}[{number}].digest",
        )
        if "gitCommit" in digest:
            commits.append(digest["gitCommit"])
            _refuse_uncommitted(dependency, digest["gitCommit"])
    if not commits:
        raise VerifyError(
            "the signed statement names no source commit (resolvedDependencies: gitCommit); it "
            "was signed outside a git checkout, so there is nothing to rebuild from"
        )
    if len(commits) > 1:
        raise _statement_error(f"{field}[].digest.gitCommit", "one source commit", commits)
    commit = commits[0]
    if not isinstance(commit, str) or re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit) is None:
        raise _statement_error("gitCommit", "a commit id (40 or 64 hex digits)", commit)
    return commit


def _epoch(internal: Mapping[str, Any]) -> int:
    epoch = internal.get("source_date_epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 < epoch <= LATEST_EPOCH:
        raise _statement_error(
            "internalParameters.source_date_epoch",
            f"seconds since 1970, 1 to {LATEST_EPOCH}",
            epoch,
        )
    return epoch


def _toolchain(internal: Mapping[str, Any]) -> dict[str, str]:
    toolchain = _mapping(internal.get("toolchain", {}), "internalParameters.toolchain")
    for key, value in toolchain.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise _statement_error(f"internalParameters.toolchain.{key}", "a string", value)
    return dict(toolchain)


def build_inputs(statement: Mapping[str, Any]) -> tuple[str, int, dict[str, str]]:
    """The commit, SOURCE_DATE_EPOCH and toolchain record the statement names; VerifyError naming
    the field when one is missing or not what the build takes."""
    predicate = _mapping(_mapping(statement, "statement").get("predicate"), "predicate")
    definition = _mapping(predicate.get("buildDefinition"), "predicate.buildDefinition")
    internal = _mapping(definition.get("internalParameters", {}), "internalParameters")
    return _commit(definition), _epoch(internal), _toolchain(internal)
