"""Digests of what a verdict reads of the checkout, for the reuse store's keys (docs/reuse.md):
the first-party code a module runs (itself, every module of ``release/`` and ``reference/`` it
imports, at any depth, function-level and TYPE_CHECKING imports included, and the packages
holding them), whole folders (the programs run by path: ``release/scripts/``, ``reference/``,
``shims/``), and every file git hands on from the checkout (what an sdist is judged against).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import subprocess
from collections.abc import Iterable
from pathlib import Path

from release.util.digests import sha256_file
from release.util.paths import REPO_ROOT

FIRST_PARTY = ("release", "reference")
# Reached by path, not by import: every gate's key holds them whole.
BY_PATH = ("release/scripts", "reference", "shims")


def _file_of(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(path: Path, root: Path) -> str:
    """The package relative imports in `path` start from (a package's own, for __init__.py)."""
    return ".".join(path.relative_to(root).with_suffix("").parts[:-1])


def _imported(path: Path, root: Path) -> frozenset[str]:
    return _imports_of(path.read_bytes(), _package_of(path, root), str(path))


@functools.cache  # by content: a file edited in place is parsed again
def _imports_of(source: bytes, package: str, filename: str) -> frozenset[str]:
    """The modules `source` names in its imports, relative ones resolved (a `from a import b`
    names both a and a.b: b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return frozenset(name for name in names if name.split(".")[0] in FIRST_PARTY)


def _closure(module: str, root: Path) -> frozenset[Path]:
    found: set[Path] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        parts = name.split(".")
        # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
        for depth in range(1, len(parts) + 1):
            path = _file_of(".".join(parts[:depth]), root)
            if path is None or path in found:
                continue
            found.add(path)
            pending += sorted(_imported(path, root))
    return frozenset(found)


def _digest(path: Path) -> str:
    return sha256_file(path)  # read each time: a checkout is edited in place


def module_sources(modules: Iterable[str], root: Path = REPO_ROOT) -> dict[str, str]:
    """Path (relative to `root`) to sha256 of every first-party file that importing `modules`
    runs."""
    files = set().union(*(_closure(module, root) for module in modules))
    return {path.relative_to(root).as_posix(): _digest(path) for path in sorted(files)}


def folder_sources(folders: Iterable[str] = BY_PATH, root: Path = REPO_ROOT) -> dict[str, str]:
    """Path to sha256 of every file under `folders` (compiled caches left out)."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                found[path.relative_to(root).as_posix()] = _digest(path)
    return found


def handed_on(source_dir: Path) -> tuple[list[str], str]:
    """The files git hands on from `source_dir` (tracked, and untracked ones no ignore rule
    covers: what an sdist of it must hold), those that exist, sorted; and a problem where git
    cannot list them."""
    listed = subprocess.run(
        ["git", "-C", str(source_dir), "ls-files", "-z", "--cached", "--others",
         "--exclude-standard"],
        capture_output=True,
    )  # fmt: skip
    if listed.returncode != 0:
        why = listed.stderr.decode(errors="replace").strip().splitlines()
        got = why[-1] if why else "no repository"
        return [], (f"{source_dir}: expected a git checkout, whose files (git ls-files) are "
                    f"what the sdist must hold; got {got}")  # fmt: skip
    names = listed.stdout.decode("utf-8", "surrogateescape").split("\0")
    return sorted(n for n in names if n and (source_dir / n).is_file()), ""


def checkout_digest(source_dir: Path) -> str:
    """The sha256 over every file git hands on from `source_dir` (`handed_on`), each by name and
    content; or why git could not list them (a key that never matches a real listing)."""
    names, problem = handed_on(source_dir)
    if problem:
        return "unlisted: " + problem
    lines = [f"{_digest(source_dir / name)}  {name}" for name in names]
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()
