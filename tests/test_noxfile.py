"""`nox -l` shows the first line of each session's docstring: it must be a whole sentence."""

from __future__ import annotations

import ast

from release.util.paths import REPO_ROOT


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
