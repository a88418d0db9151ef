"""The local stand-in of each action the generated workflow uses, found by the action's pinned
ref (release/ci/actions.py); each prints what it does instead when it is used.

* ``actions/checkout``: a clone of the replayed repository at the commit (full history for
  ``fetch-depth: 0``, else one commit), into the job's workspace; nothing to persist
  credentials for;
* ``actions/setup-python``: each asked version's pyenv interpreter, in a virtual environment of
  its own with pip at the replay's pip version (setup-python's interpreters come with a pip that
  takes ``--group``; pyenv's do not): on a hosted job a new one per job, as a fresh runner's; on
  a self-hosted job one kept in the runner's tool cache, as setup-python keeps its interpreters
  there. Each version's ``bin`` goes before PATH in turn, so the last version asked is
  ``python`` (as setup-python documents), and ``pythonX.Y`` is each one;
* ``actions/upload-artifact``: the matched files copied into ``<run>/artifacts/<name>/``, paths
  kept relative to the search paths' least common ancestor, hidden files left out, a name
  uploaded twice refused, ``if-no-files-found`` honoured;
* ``actions/download-artifact``: one artifact by ``name``, or those ``pattern`` matches (all when
  neither is given), into ``path``, each in a folder of its name unless ``merge-multiple``.

An action with no stand-in, or an input a stand-in does not read, is refused naming it: what
runs must be what the workflow says.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from release.ci.actions import CHECKOUT, DOWNLOAD, SETUP_PYTHON, UPLOAD, ActionPin
from release.ci.replay_context import JobState, RefusedError, StandInError
from release.ci.replay_process import quiet
from release.util.interpreters import find_interpreter

StandInRun = Callable[[JobState, Mapping[str, Any]], None]


@dataclass(frozen=True)
class StandIn:
    pin: ActionPin
    inputs: frozenset[str]  # the inputs it reads; any other is refused
    run: StandInRun
    says: str  # what it does instead, printed when it is used


def _truth(value: Any) -> bool:
    return str(value).strip().lower() == "true"


# --- checkout ---


def checkout(state: JobState, inputs: Mapping[str, Any]) -> None:
    replay = state.replay
    depth = int(str(inputs.get("fetch-depth", 1)).strip() or 1)
    workspace = state.workspace
    if depth == 0:
        quiet(
            [
                "git",
                "clone",
                "--quiet",
                "--no-checkout",
                "--no-hardlinks",
                str(replay.repository),
                str(workspace),
            ],
            state,
            cwd=workspace.parent,
        )
    else:
        quiet(["git", "init", "--quiet", str(workspace)], state, cwd=workspace.parent)
        quiet(
            [
                "git",
                "-C",
                str(workspace),
                "fetch",
                "--quiet",
                f"--depth={depth}",
                str(replay.repository),
                replay.commit,
            ],
            state,
        )
    quiet(["git", "-C", str(workspace), "checkout", "--quiet", "--detach", replay.commit], state)
    state.say(
        f"checked out {replay.commit} of {replay.repository} into {workspace} "
        f"({'full history' if depth == 0 else f'{depth} commit(s)'})"
    )


# --- setup-python ---


def replay_pip_version() -> str:
    """The pip every stand-in interpreter gets: the replay's own (it takes ``--group``)."""
    return metadata.version("pip")


def _interpreter_env(folder: Path, version: str, state: JobState) -> Path:
    """A virtual environment of pyenv's ``version`` in ``folder``, made once and reused while it
    is whole (a venv names its own folder in its scripts, so it is made where it stays, and its
    marker is written last)."""
    wanted = replay_pip_version()
    marker = folder / ".replay-ready"
    if marker.is_file() and marker.read_text() == wanted and (folder / "bin" / "python").exists():
        return folder
    base = find_interpreter(version)
    if base is None:
        raise StandInError(
            f"python-version {version}: no CPython {version} under pyenv or on "
            "PATH (pyenv install it)"
        )
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Without pip, then pip put in by the replay's own: an interpreter built without ensurepip
    # (a stripped runner build, as the GPU machine's) makes its environment as any other does.
    quiet([str(base), "-m", "venv", "--without-pip", str(folder)], state, cwd=folder.parent)
    quiet(
        [sys.executable, "-m", "pip", "--python", str(folder / "bin" / "python"), "install",
         "--quiet", f"pip=={wanted}"],
        state,
        cwd=folder,
    )  # fmt: skip
    marker.write_text(wanted)
    return folder


def setup_python(state: JobState, inputs: Mapping[str, Any]) -> None:
    versions = [v.strip() for v in str(inputs.get("python-version", "")).splitlines() if v.strip()]
    if not versions:
        raise StandInError("python-version: expected one version or more; got none")
    root = state.replay.tool_cache if state.self_hosted else state.temp.parent / "toolcache"
    folders = []
    for version in versions:
        folder = _interpreter_env(root / "Python" / version, version, state)
        folders.append(folder)
        state.say(f"python{version}: {find_interpreter(version)} in the environment {folder}")
    # setup-python adds each version in turn before PATH: the last asked comes first.
    state.prepend_path([str(folder / "bin") for folder in reversed(folders)])
    last = str(folders[-1])
    for name in ("pythonLocation", "Python_ROOT_DIR", "Python2_ROOT_DIR", "Python3_ROOT_DIR"):
        state.env[name] = last
    state.say(f"python is {versions[-1]} (the last version asked, as setup-python makes it)")


# --- artifacts ---


def _search_root(pattern: str, workspace: Path) -> Path:
    """The part of a search path before its first wildcard (a file's folder)."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    root = workspace.joinpath(*fixed) if fixed else workspace
    return root if len(fixed) < len(parts) or root.is_dir() else root.parent


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def upload_artifact(state: JobState, inputs: Mapping[str, Any]) -> None:
    name = str(inputs.get("name") or "artifact")
    lines = [line.strip() for line in str(inputs.get("path", "")).splitlines() if line.strip()]
    include = [line for line in lines if not line.startswith("!")]
    exclude = [line[1:] for line in lines if line.startswith("!")]
    missing = str(inputs.get("if-no-files-found", "warn")).strip()
    if missing not in ("warn", "error", "ignore"):
        raise StandInError(f"if-no-files-found: expected warn, error or ignore; got {missing!r}")
    workspace = state.workspace
    files: set[Path] = set()
    for pattern in include:
        for match in glob.glob(str(workspace / pattern), recursive=True):
            path = Path(match)
            found = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
            files.update(p for p in found if p.is_file())
    for pattern in exclude:
        files -= {Path(m) for m in glob.glob(str(workspace / pattern), recursive=True)}
    roots = [_search_root(pattern, workspace) for pattern in include]
    root = Path(os.path.commonpath([str(r) for r in roots])) if roots else workspace
    hidden = inputs.get("include-hidden-files") not in (True, "true")
    files = {f for f in files if not (hidden and _hidden(f, root))}
    if not files:
        said = f"no files were found with the provided path: {', '.join(lines)}"
        if missing == "error":
            raise StandInError(said)
        state.say(f"{'warning: ' if missing == 'warn' else ''}{said}; no artifact uploaded")
        return
    target = state.replay.artifacts / name
    if target.exists():
        if not _truth(inputs.get("overwrite", False)):
            raise StandInError(f"an artifact named {name!r} was already uploaded in this run")
        shutil.rmtree(target)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for file in sorted(files):
        destination = partial / file.relative_to(root)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, destination)
    partial.rename(target)
    state.say(f"artifact {name}: {len(files)} file(s) from {root} into {target}")


def download_artifact(state: JobState, inputs: Mapping[str, Any]) -> None:
    store = state.replay.artifacts
    present = sorted(p.name for p in store.iterdir() if p.is_dir()) if store.is_dir() else []
    present = [p for p in present if not p.endswith(".partial")]
    name, pattern = inputs.get("name"), inputs.get("pattern")
    if name:
        if name not in present:
            raise StandInError(
                f"artifact not found for name: {name} (this run has {', '.join(present) or 'none'})"
            )
        chosen, merge = [str(name)], True  # one artifact by name lands in path itself
    else:
        chosen = [p for p in present if pattern is None or fnmatch.fnmatchcase(p, str(pattern))]
        merge = _truth(inputs.get("merge-multiple", False))
    destination = state.workspace / str(inputs.get("path") or ".")
    for artifact in chosen:
        into = destination if merge else destination / artifact
        shutil.copytree(store / artifact, into, dirs_exist_ok=True)
    state.say(
        f"{len(chosen)} artifact(s) ({', '.join(chosen) or 'none matched'}) from {store} "
        f"into {destination}{' (merged)' if merge and len(chosen) > 1 else ''}"
    )


STAND_INS: dict[str, StandIn] = {
    stand_in.pin.repo: stand_in
    for stand_in in (
        StandIn(
            CHECKOUT,
            frozenset({"fetch-depth", "persist-credentials"}),
            checkout,
            "a clone of the replayed repository at the commit",
        ),
        StandIn(
            SETUP_PYTHON,
            frozenset({"python-version"}),
            setup_python,
            "the pyenv interpreters, each in a virtual environment",
        ),
        StandIn(
            UPLOAD,
            frozenset(
                {
                    "name",
                    "path",
                    "if-no-files-found",
                    "overwrite",
                    "include-hidden-files",
                    "retention-days",
                }
            ),
            upload_artifact,
            "a copy into the run's artifacts folder",
        ),
        StandIn(
            DOWNLOAD,
            frozenset({"name", "pattern", "merge-multiple", "path"}),
            download_artifact,
            "a copy from the run's artifacts folder",
        ),
    )
}


def stand_in_for(uses: str, where: str) -> StandIn:
    """The stand-in of ``uses`` (``owner/repo@sha``); RefusedError for an action without one, or
    for another ref than the generator pins (its stand-in was written for that version)."""
    repo, _, ref = uses.partition("@")
    stand_in = STAND_INS.get(repo)
    if stand_in is None:
        raise RefusedError(
            f"{where}: uses {uses}: no local stand-in for this action (the replay "
            f"has them for {', '.join(sorted(STAND_INS))})"
        )
    if ref != stand_in.pin.sha:
        raise RefusedError(
            f"{where}: uses {uses}: expected {stand_in.pin.ref} "
            f"({stand_in.pin.tag}), the version its stand-in follows"
        )
    return stand_in


def check_inputs(stand_in: StandIn, inputs: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(inputs) - stand_in.inputs)
    if unknown:
        raise RefusedError(
            f"{where}: with: {', '.join(unknown)}: the stand-in of "
            f"{stand_in.pin.repo} reads only {', '.join(sorted(stand_in.inputs))}"
        )
