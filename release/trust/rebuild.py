"""The consumer's rebuild check (`python -m release rebuild --index URL NAME==VERSION --source
PATH_OR_URL`): is the published wheel what its recorded commit builds?

With the same trust inputs as `verify --index` (the trusted TUF root and the provenance signer's
public key), the release's signed statement is verified first; the wheel for one Python version is
downloaded by pip from the index alone and must be the statement's subject and its TUF target.
The statement names the commit and SOURCE_DATE_EPOCH; that commit is checked out from `--source`
into a fresh folder, and that commit's own `python -m release build --fresh` makes the wheel
again: new build trees, neither ccache nor the wheel cache (the toolchain itself, zig's runtime
libraries included, comes from the consumer's cache), with the build tools pinned at that commit.
The two wheels must be bit-identical; otherwise the first differing member and byte are named.
The toolchain the rebuild used is compared with the recorded one (paths aside), so a difference
can be told apart from a rebuild on other tools.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from release.build.reproduce import wheel_differences
from release.build.wheels import run_logged
from release.errors import BuildError, ReleaseError, VerifyError
from release.trust.sign import subject_digests
from release.trust.tuf_client import TrustedIndex
from release.trust.verify import parse_requirement, tuf_url_for, verified_statement
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter
from release.util.private_site import clean_pip_env

# Toolchain record keys that do not decide a wheel's bytes: where a tool lies, and ccache.
_NOT_COMPARED = ("_path", "ccache")
# The latest SOURCE_DATE_EPOCH the build takes (9999-12-31T23:59:59Z): GCC and Clang refuse a
# later one, and so does cmake/write_sbom.py (Python's datetime ends there).
LATEST_EPOCH = 253402300799
# Written into the work folder when it is made: only a folder holding it is ever removed.
_WORKDIR_MARK = ".activekv-rebuild"


@dataclass(frozen=True)
class RebuildResult:
    wheel: str
    commit: str
    published_sha256: str
    rebuilt_sha256: str
    differences: tuple[str, ...]  # empty: bit-identical
    toolchain_differences: tuple[str, ...]

    @property
    def identical(self) -> bool:
        return self.published_sha256 == self.rebuilt_sha256


def rebuild_release(
    *,
    index_url: str,
    requirement: str,
    trusted_root: Path,
    provenance_key: Path,
    source: str,
    python: str,
    workdir: Path,
    build_cache: Path,
    tuf_url: str | None = None,
    tuf_cache: Path | None = None,
) -> RebuildResult:
    """Verifies, downloads, checks out, rebuilds and compares; the result either way.
    `build_cache` holds the toolchain (ACTIVEKV_CACHE_DIR); nothing compiled is taken from it."""
    project, version = parse_requirement(requirement)
    interpreter = _interpreter(python)
    _check_workdir(workdir)
    source = _source(source, workdir)
    if tuf_cache is not None:
        _check_apart(tuf_cache, "--tuf-cache", workdir)
    trusted = TrustedIndex(tuf_url or tuf_url_for(index_url), trusted_root, tuf_cache)
    _check_apart(trusted.cache_dir, "--tuf-cache", workdir)  # the default one too
    _fresh_workdir(workdir)
    statement = verified_statement(trusted, project, version, provenance_key, workdir)
    commit, epoch, recorded = _build_inputs(statement)

    pinned = f"{project}=={version}"  # as parsed: nothing else of the argument reaches pip
    published = _download(index_url, pinned, interpreter, workdir / "published")
    trusted.check_file(published)
    try:
        signed = subject_digests(statement)
    except ReleaseError as error:
        raise VerifyError(f"the signed statement's subject: {error}") from None
    published_sha256 = sha256_file(published)
    if signed.get(published.name) != published_sha256:
        raise VerifyError(
            f"{published.name} from {index_url} is not the signed statement's subject of that "
            "name (digest differs or not named)"
        )

    checkout = _checkout(source, commit, workdir / "source")
    rebuilt, used = _build(checkout, published.name, epoch, workdir, build_cache)
    rebuilt_sha256 = sha256_file(rebuilt)
    same = published_sha256 == rebuilt_sha256
    return RebuildResult(
        wheel=published.name,
        commit=commit,
        published_sha256=published_sha256,
        rebuilt_sha256=rebuilt_sha256,
        differences=() if same else tuple(wheel_differences(published, rebuilt)),
        toolchain_differences=tuple(toolchain_differences(recorded, used)),
    )


def _check_workdir(workdir: Path) -> None:
    """VerifyError unless the work folder is a folder or can be made one: it and each folder above
    it that exists must be a folder."""
    for path in (workdir, *workdir.parents):
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise VerifyError(
                    f"--out: expected {path} to be a folder (it holds the rebuild's "
                    f"work folder {workdir}); it is a file"
                )
            return


def _check_apart(path: Path, flag: str, workdir: Path) -> None:
    """VerifyError when `path` is the work folder, lies in it or holds it: the work folder is
    emptied before each rebuild."""
    given, work = path.resolve(), workdir.resolve()
    if given.is_relative_to(work) or work.is_relative_to(given):
        raise VerifyError(
            f"{flag} {path}: expected a folder apart from the rebuild's work folder "
            f"{workdir} (under --out), which is emptied before each rebuild; "
            "choose another --out"
        )


def _local_folder(source: str) -> Path | None:
    """The folder `--source` names on this machine (a path or a file:// URL); None for a URL."""
    if "://" in source and not source.startswith("file://"):
        return None
    path = Path(source.removeprefix("file://"))
    return path if path.exists() else None


def _source(source: str, workdir: Path) -> str:
    """`--source` as git is given it: a local folder as an absolute path (git runs in the work
    folder), which must not be the work folder or lie in it. A folder holding the work folder
    (`--source .` with the default --out) is fine: only the work folder is emptied, and only when
    it carries the mark (_fresh_workdir)."""
    local = _local_folder(source)
    if local is None:
        return source
    if local.resolve().is_relative_to(workdir.resolve()):
        raise VerifyError(
            f"--source {source}: expected a git repository outside the rebuild's work folder "
            f"{workdir} (under --out), which is emptied before each rebuild; choose another --out"
        )
    return str(local.resolve())


def _fresh_workdir(workdir: Path) -> None:
    """An empty work folder, marked as this command's. An existing one is removed only when it is
    empty or carries the mark: a folder of someone else's at that path is never deleted."""
    if workdir.is_dir() and not workdir.is_symlink():
        if any(workdir.iterdir()) and not (workdir / _WORKDIR_MARK).is_file():
            raise VerifyError(
                f"--out: {workdir} is a folder this command did not make (no "
                f"{_WORKDIR_MARK} in it); expected none there, or the work folder "
                "of an earlier rebuild: move it away or choose another --out"
            )
        shutil.rmtree(workdir)
    elif workdir.is_symlink():
        raise VerifyError(
            f"--out: {workdir} is a symbolic link; expected the rebuild's own "
            "work folder there, or nothing"
        )
    try:
        workdir.mkdir(parents=True)
        (workdir / _WORKDIR_MARK).write_text("the work folder of `python -m release rebuild`\n")
    except OSError as error:
        raise VerifyError(
            f"--out: cannot make the work folder {workdir} ({error.strerror or error})"
        ) from None


def _statement_error(field: str, expected: str, got: object) -> VerifyError:
    return VerifyError(f"the signed statement's {field}: expected {expected}; got {got!r}")


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _statement_error(field, "an object", value)
    return value


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


def _build_inputs(statement: Mapping[str, Any]) -> tuple[str, int, dict[str, str]]:
    """The commit, SOURCE_DATE_EPOCH and toolchain record the statement names; VerifyError naming
    the field when one is missing or not what the build takes."""
    predicate = _mapping(_mapping(statement, "statement").get("predicate"), "predicate")
    definition = _mapping(predicate.get("buildDefinition"), "predicate.buildDefinition")
    internal = _mapping(definition.get("internalParameters", {}), "internalParameters")
    return _commit(definition), _epoch(internal), _toolchain(internal)


def toolchain_differences(recorded: Mapping[str, str], used: Mapping[str, str]) -> list[str]:
    """Each tool whose version or digest differs between the record and the rebuild."""
    keys = sorted(k for k in set(recorded) | set(used) if not k.endswith(_NOT_COMPARED))
    return [f"{key}: recorded {recorded.get(key)!r}, rebuilt with {used.get(key)!r}"
            for key in keys if recorded.get(key) != used.get(key)]  # fmt: skip


def _run(command: list[str], what: str, cwd: Path, env: Mapping[str, str], log: Path) -> None:
    try:
        run_logged(command, env, log, what, cwd=cwd)
    except BuildError as error:
        raise VerifyError(str(error)) from None


def _interpreter(python: str) -> Path:
    """The interpreter whose wheel to rebuild, found before anything is fetched."""
    if re.fullmatch(r"3\.\d{1,2}", python) is None:
        raise VerifyError(f"--python: expected a Python version X.Y, e.g. 3.12; got {python!r}")
    interpreter = find_interpreter(python)
    if interpreter is None:
        raise VerifyError(f"--python {python}: no python{python} on PATH or under pyenv")
    return interpreter


def _download(index_url: str, requirement: str, interpreter: Path, folder: Path) -> Path:
    """The wheel pip picks for `interpreter` from the index alone (no configured source)."""
    command = [str(interpreter), "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--index-url", index_url, "-d", str(folder), requirement]  # fmt: skip
    folder.mkdir(parents=True)
    _run(command, f"pip download of {requirement} from {index_url}", folder, clean_pip_env(),
         folder.parent / "download.log")  # fmt: skip
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise VerifyError(f"pip download of {requirement} gave {[w.name for w in wheels]}")
    return wheels[0]


def _checkout(source: str, commit: str, folder: Path) -> Path:
    log = folder.parent / "checkout.log"
    env = dict(clean_pip_env(), GIT_TERMINAL_PROMPT="0")
    _run(["git", "clone", "--quiet", "--no-checkout", "--", source, str(folder)],
         f"git clone of --source {source}", folder.parent, env, log)  # fmt: skip
    try:
        _run(["git", "-C", str(folder), "checkout", "--quiet", "--detach", commit],
             f"checking out {commit}", folder.parent, env, log)  # fmt: skip
    except VerifyError:
        raise VerifyError(
            f"--source {source}: has no commit {commit} (the one the signed statement names)"
        ) from None
    return folder


def _build(
    checkout: Path, wheel_name: str, epoch: int, workdir: Path, cache_dir: Path
) -> tuple[Path, dict[str, str]]:
    """That commit's own fresh build of the wheel; the wheel and the toolchain it recorded."""
    _, _, _, tags = parse_wheel_filename(wheel_name)
    interpreter = sorted(tag.interpreter for tag in tags)[0]  # cp312 (abi3: the oldest served)
    python = f"{interpreter[2]}.{interpreter[3:]}"
    out = workdir / "rebuilt"
    # The toolchain comes from the consumer's own cache (zig's runtime libraries, the pinned
    # requirements' files); the wheel is compiled afresh (--fresh: new build trees, no ccache, no
    # wheel cache). This machine's package sources fetch the build requirements, as for any build.
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), ACTIVEKV_CACHE_DIR=str(cache_dir))
    command = [sys.executable, "-m", "release", "build", "--fresh", "--python", python,
               "--out", str(out)]  # fmt: skip
    _run(command, f"the rebuild of {wheel_name} (python -m release build at that commit)",
         checkout, env, workdir / "rebuild.log")  # fmt: skip
    rebuilt = out / "wheels" / wheel_name
    if not rebuilt.is_file():
        made = sorted(p.name for p in (out / "wheels").glob("*.whl"))
        raise VerifyError(f"the rebuild made {made}, not {wheel_name}")
    record = json.loads((out / "build.json").read_text())
    return rebuilt, dict(record.get("toolchain", {}))
