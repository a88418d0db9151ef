"""Loading a manifest: the TOML read and validated against the models, the cross-references
between sections checked, and every problem one line of the ``ManifestError``."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from packaging.specifiers import SpecifierSet
from pydantic import ValidationError

from release import catalogue
from release.catalogue import ServedPathSettings
from release.errors import ManifestError
from release.manifest.fields import MAX_MANIFEST_BYTES, REQUIRED_CHANNELS
from release.manifest.messages import (
    Issue,
    Loc,
    choices,
    error_line,
    from_pydantic,
    shown,
    syntax_error,
)
from release.manifest.models import CiSettings, Manifest, publish_references
from release.util.paths import PYPROJECT
from release.util.pins import pyproject

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def load_manifest(path: Path) -> Manifest:
    """Read, validate and cross-check the manifest at ``path``."""
    text = _read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(syntax_error(path, exc)) from None
    except RecursionError:
        raise ManifestError(f"{path}: expected TOML of ordinary depth; got tables or arrays "
                            "nested too deep to read") from None  # fmt: skip
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        issues = [from_pydantic(error, Manifest) for error in exc.errors()]
    else:
        issues = _cross_references(manifest)
    if issues:
        raise ManifestError(
            "\n".join(error_line(path, issue.loc, issue.expected, issue.got) for issue in issues)
        )
    manifest._path = path
    return manifest


def _read_text(path: Path) -> str:
    """The manifest's text: a regular file (never a FIFO or a device) of at most 1 MiB."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ManifestError(f"{path}: expected a regular manifest file; got a "
                                f"{_file_kind(info.st_mode)}")  # fmt: skip
        if info.st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{path}: expected a manifest of at most 1 MiB; got "
                                f"{info.st_size} bytes")  # fmt: skip
        with path.open("rb") as stream:
            data = stream.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(f"{path}: expected a manifest file; got no such file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ManifestError(f"{path!r}: expected a readable manifest file; got {exc}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: expected a manifest of at most 1 MiB; got more")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: expected UTF-8 text; got {exc.reason}") from None


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "device"),
             (stat.S_ISBLK, "device"), (stat.S_ISSOCK, "socket"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "special file")


def _cross_references(m: Manifest) -> list[Issue]:
    """Checks that span tables: names that must refer to declared entries."""
    issues: list[Issue] = []
    channels = m.release.channels
    known_channels = choices(sorted(channels), "or")
    if m.release.default_channel not in channels:
        issues.append(
            Issue(
                ("release", "default_channel"),
                f"a declared channel {known_channels}",
                shown(m.release.default_channel),
            )
        )
    missing = [name for name in REQUIRED_CHANNELS if name not in channels]
    if missing:
        issues.append(
            Issue(
                ("release", "channels"),
                "channels that include " + choices(REQUIRED_CHANNELS, "and"),
                shown(sorted(channels)),
            )
        )
    for name, channel in channels.items():
        loc: Loc = ("release", "channels", name)
        for index, gate in enumerate(channel.requires):
            if gate not in m.gates:
                issues.append(
                    Issue(
                        (*loc, "requires", index),
                        "a gate declared in [gates.*], " + choices(sorted(m.gates), "or"),
                        shown(gate),
                    )
                )
        unattested: dict[str, list[str]] = {}  # runner class -> required gates it runs
        for gate in channel.requires:
            runner = catalogue.runner_of(gate) if gate in catalogue.names() else None
            if runner is not None and runner not in channel.attesters:
                unattested.setdefault(runner, []).append(gate)
        for runner, gates in unattested.items():
            issues.append(
                Issue(
                    (*loc, "attesters"),
                    f'keys for "{runner}", which runs the required {choices(gates, "and")}',
                    shown(sorted(channel.attesters)),
                )
            )
        signer = m.sign.get(channel.signing)
        if signer is None:
            issues.append(
                Issue(
                    (*loc, "signing"),
                    "a key declared in [sign.*], " + choices(sorted(m.sign), "or"),
                    shown(channel.signing),
                )
            )
        elif name == "stable" and signer.generated:
            issues.append(
                Issue(
                    (*loc, "signing"),
                    'a [sign.*] entry whose key is not "generate" (dev keys never sign stable)',
                    shown(channel.signing),
                )
            )
    issues += _pyproject_references(m)
    issues += publish_references(m.publish)
    if m.build.stable_abi_from not in m.build.python:
        issues.append(
            Issue(
                ("build", "stable_abi_from"),
                "one of build.python, " + choices(m.build.python, "or"),
                shown(m.build.stable_abi_from),
            )
        )
    if m.ci is not None:
        issues += _ci_references(m, m.ci)
    issues += _gate_references(m)
    issues += _served_path_references(m)
    if "parity" in m.gates and not m.gates["parity"].cells:
        issues.append(
            Issue(("gates", "parity", "cells"), "a non-empty array of parity cells", "nothing")
        )
    for name, gate in m.gates.items():
        if name != "warmup":
            continue
        for key in ("warmup_steps", "steady_steps"):
            if getattr(gate, key) is None:
                issues.append(
                    Issue(
                        ("gates", name, key),
                        "a positive integer (the warm-up gate needs it)",
                        "nothing",
                    )
                )
    return issues


def _pyproject_references(m: Manifest) -> list[Issue]:
    """The release is the distribution pyproject.toml builds, for Pythons it allows."""
    project = pyproject().get("project", {})
    issues: list[Issue] = []
    name = project.get("name")
    if m.release.name != name:
        expected = f"{shown(name)}, the name pyproject.toml builds ({PYPROJECT})"
        issues.append(Issue(("release", "name"), expected, shown(m.release.name)))
    allowed = SpecifierSet(project.get("requires-python", ""))
    for index, version in enumerate(m.build.python):
        if f"{version}.0" not in allowed:
            expected = f"a version pyproject.toml's requires-python ({allowed}) allows"
            issues.append(Issue(("build", "python", index), expected, shown(version)))
    return issues


def _gate_references(m: Manifest) -> list[Issue]:
    """[gates.<name>] names a gate of the catalogue, on the runner that gate needs (its own
    model, checked as the table was read, allows only the parameters that gate reads)."""
    issues: list[Issue] = []
    known = catalogue.names()
    for name, gate in m.gates.items():
        if name not in known:
            issues.append(
                Issue(
                    ("gates", name),
                    "a gate the pipeline has, " + choices(known, "or"),
                    "an unknown gate",
                )
            )
        elif gate.runner != catalogue.runner_of(name):
            needed = catalogue.runner_of(name)
            issues.append(
                Issue(
                    ("gates", name, "runner"),
                    f'"{needed}" (the {name} gate runs there)',
                    shown(gate.runner),
                )
            )
    return issues


def _served_path_references(m: Manifest) -> list[Issue]:
    """[gates.served-path] installs each vLLM release the connector's shim pins, and no other,
    each in a Python of build.python (the CI workflow's setup-python provides those)."""
    gate = m.gates.get("served-path")
    if not isinstance(gate, ServedPathSettings):
        return []
    issues: list[Issue] = []
    for index, install in enumerate(gate.installs):
        if install.python not in m.build.python:
            issues.append(
                Issue(("gates", "served-path", "installs", index, "python"),
                      "one of build.python, " + choices(m.build.python, "or"),
                      shown(install.python))
            )  # fmt: skip
    pins = [p.version for s in m.payload.shims if s.framework == "vllm" for p in s.versions]
    installed = [install.version for install in gate.installs]
    if pins and sorted(installed) != sorted(pins):
        expected = f"one install for each vLLM release payload.shims pins ({', '.join(pins)})"
        issues.append(Issue(("gates", "served-path", "installs"), expected, shown(installed)))
    return issues


def _ci_references(m: Manifest, ci: CiSettings) -> list[Issue]:
    """[ci] names a declared Python version and declared channels, its tag channel among them."""
    issues: list[Issue] = []
    if ci.gpu_python not in m.build.python:
        issues.append(
            Issue(
                ("ci", "gpu_python"),
                "one of build.python, " + choices(m.build.python, "or"),
                shown(ci.gpu_python),
            )
        )
    # A missing required channel is reported once, at release.channels.
    known = set(m.release.channels) | set(REQUIRED_CHANNELS)
    for index, channel in enumerate(ci.channels):
        if channel not in known:
            issues.append(
                Issue(
                    ("ci", "channels", index),
                    "a declared channel " + choices(sorted(m.release.channels), "or"),
                    shown(channel),
                )
            )
    if ci.tag_channel is not None and ci.tag_channel not in ci.channels:
        issues.append(
            Issue(
                ("ci", "tag_channel"),
                "one of ci.channels, " + choices(ci.channels, "or"),
                shown(ci.tag_channel),
            )
        )
    return issues
