"""The noxfile: `nox -l` shows the first line of each session's docstring, which must be a whole
sentence; its interpreters and the release session's vLLM come from the manifest."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def _sessions() -> dict[str, str]:
    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text(encoding="utf-8"))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
            "session" in ast.unparse(decorator) for decorator in node.decorator_list
        ):
            found[node.name] = ast.get_docstring(node) or ""
    return found


def test_every_session_lists_a_whole_sentence() -> None:
    sessions = _sessions()
    assert len(sessions) >= 10
    for name, docstring in sessions.items():
        first = docstring.splitlines()[0] if docstring else ""
        assert first[:1].isupper() and first.endswith("."), (name, first)
        assert first.count("(") == first.count(")") and first.count("`") % 2 == 0, (name, first)
        assert len(first) <= 100, (name, first)


def test_the_noxfile_names_no_python_version() -> None:
    """Its interpreters come from the manifest (build.stable_abi_from), as nox's own noxfile
    takes them from its project: a version written here would drift from the manifest's."""
    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text(encoding="utf-8"))
    versions = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"3\.[0-9]+", node.value)
    ]
    assert versions == []


def _served_path_rule() -> Callable[[list[str]], str | None]:
    """The noxfile's `_requires_served_path`, run without nox (its load_toml is tomllib's)."""
    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text(encoding="utf-8"))
    wanted = {"_option", "_requires_served_path"}
    module = ast.Module([n for n in tree.body if getattr(n, "name", None) in wanted], [])
    project = SimpleNamespace(load_toml=lambda path: tomllib.loads(Path(path).read_text()))
    namespace: dict[str, Any] = {
        "nox": SimpleNamespace(project=project), "Path": Path, "MANIFEST": DEFAULT_MANIFEST,
    }  # fmt: skip
    exec(compile(module, "noxfile.py", "exec"), namespace)
    return namespace["_requires_served_path"]


def test_the_release_session_installs_vllm_where_the_manifest_requires_the_served_path(
    tmp_path: Path,
) -> None:
    rule = _served_path_rule()
    assert rule([]) is None  # dev, the manifest's default channel
    assert rule(["--channel", "stable", "--key-dir", "k"]) == "stable"
    assert rule(["--channel=stable"]) == "stable"
    other = tmp_path / "other.toml"  # a manifest whose dev requires the served path
    text = DEFAULT_MANIFEST.read_text()
    dev = 'requires = ["policy", "payload", "casters"]'
    assert dev in text
    other.write_text(text.replace(dev, 'requires = ["policy", "served-path"]'))
    assert rule(["--manifest", str(other)]) == "dev"
    assert rule(["--channel", "nightly"]) is None  # left for `release run` to refuse
    assert rule(["--manifest", str(tmp_path / "absent.toml")]) is None
