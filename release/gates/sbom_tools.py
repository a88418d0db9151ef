"""The build tools an SBOM names (metadata.tools.components): which ones, each with the version
and sha256 cmake/write_sbom.py gives it, with or without the pipeline's toolchain record."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from release.gates.sbom_document import SHA256, Component, canonical_json, clip, repeated


class _Tool(NamedTuple):
    """What cmake/write_sbom.py gives one build tool: a version, a sha256, and whether every
    build of that kind names the tool."""

    version: bool
    sha256: bool
    required: bool = True


# The tools (metadata.tools.components) the writer names: with the pipeline's toolchain record,
# each with the version and sha256 the record holds; without one (a plain `pip wheel .`,
# cibuildwheel in CI), the compilers and cmake CMake ran, hashed, the host compiler unversioned
# (and only when CUDA names one), nanobind and scikit-build-core by version alone. Either way
# cyclonedx-python-lib names itself, versioned, unhashed.
_RECORDED_TOOLS = {
    **dict.fromkeys(
        ("zig", "nvcc", "cuda-host-compiler", "cmake", "nanobind", "scikit-build-core"),
        _Tool(version=True, sha256=True),
    ),
    "cyclonedx-python-lib": _Tool(version=True, sha256=False),
}


_OBSERVED_TOOLS = {
    "cxx-compiler": _Tool(version=True, sha256=True),
    "nvcc": _Tool(version=True, sha256=True),
    "cuda-host-compiler": _Tool(version=False, sha256=True, required=False),
    "cmake": _Tool(version=True, sha256=True),
    "nanobind": _Tool(version=True, sha256=False),
    "scikit-build-core": _Tool(version=True, sha256=False),
    "cyclonedx-python-lib": _Tool(version=True, sha256=False),
}


# A tool's exact version as cmake/write_sbom.py gives it (TOOL_VERSION there): major.minor.patch,
# perhaps with a pre-release or build suffix; never a `--version` banner or a release ("13.0").
_TOOL_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:[-+~][0-9A-Za-z.+~-]+)?")


def tool_problems(document: dict[str, Any]) -> list[str]:
    """metadata.tools as the writer gives it: a `components` list of the tools of a build with a
    toolchain record (_RECORDED_TOOLS) or of one without (_OBSERVED_TOOLS), each named once and
    each with the version and sha256 the writer gives it, and no other tool."""
    tools = document.get("metadata", {}).get("tools")
    if not isinstance(tools, dict) or set(tools) != {"components"}:
        shown = sorted(tools) if isinstance(tools, dict) else clip(canonical_json(tools), 120)
        return [
            "metadata.tools: expected an object of the tools' components only "
            f"(cmake/write_sbom.py); got {shown}"
        ]
    names = [tool.get("name") for tool in tools["components"]]
    recorded = "zig" in names  # only a build with a toolchain record names zig
    expected = _RECORDED_TOOLS if recorded else _OBSERVED_TOOLS
    build = "a build with a toolchain record" if recorded else "a build without a toolchain record"
    problems = [
        f"metadata.tools: expected {name} once; got it {count} times"
        for name, count in repeated(names)
    ]
    required = sorted(name for name, tool in expected.items() if tool.required)
    if missing := sorted(set(required) - set(names)):
        problems.append(
            f"metadata.tools: expected the tools {required} (cmake/write_sbom.py, {build}); "
            f"got none of {missing}"
        )
    for index, tool in enumerate(tools["components"]):
        where = f"metadata.tools.components[{index}] ({tool.get('name')})"
        if tool.get("name") not in expected:
            problems.append(
                f"{where}: expected only the tools {sorted(expected)} (cmake/write_sbom.py, "
                f"{build}); got {tool.get('name')!r}"
            )
        else:
            problems += _one_tool_problems(where, tool, expected[tool.get("name")])
    return problems


def _one_tool_problems(where: str, tool: Component, expected: _Tool) -> list[str]:
    """One tool's version and sha256, each there exactly when the writer gives it."""
    problems: list[str] = []
    version = tool.get("version")
    if expected.version and not (
        isinstance(version, str) and _TOOL_VERSION.fullmatch(version) is not None
    ):
        problems.append(
            f"{where}: version: expected the tool's exact version, a number major.minor.patch "
            f"(cmake/write_sbom.py), not a banner; got {version!r}"
        )
    if not expected.version and version is not None:
        problems.append(
            f"{where}: version: expected none (cmake/write_sbom.py has none to give); "
            f"got {version!r}"
        )
    hashes = tool.get("hashes")
    if expected.sha256 and not _one_sha256(hashes):
        problems.append(
            f"{where}: hashes: expected one SHA-256 of 64 lowercase hex digits, not all zero "
            f"(cmake/write_sbom.py); got {canonical_json(hashes)}"
        )
    if not expected.sha256 and hashes is not None:
        problems.append(
            f"{where}: hashes: expected none (cmake/write_sbom.py has no file of it to hash); "
            f"got {canonical_json(hashes)}"
        )
    return problems


def _one_sha256(hashes: Any) -> bool:
    """One SHA-256 of the writer's form. All zeros is no file's digest: it is what a scrubbed
    or placeholder digest reads, the one made-up value the gate can tell without the record."""
    if not isinstance(hashes, list) or len(hashes) != 1 or hashes[0].get("alg") != "SHA-256":
        return False
    content = hashes[0].get("content", "")
    return SHA256.fullmatch(content) is not None and content != "0" * 64
