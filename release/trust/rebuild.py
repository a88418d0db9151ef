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
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from release.errors import BuildError, ReleaseError, VerifyError
from release.manifest import NetworkLimits
from release.trust.build_inputs import build_inputs
from release.trust.rebuild_workdir import check_apart, check_workdir, fresh_workdir, git_source
from release.trust.tuf_client import TrustedIndex
from release.trust.verify import parse_requirement, tuf_url_for, verified_statement
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter
from release.util.logged import run_logged
from release.util.private_site import clean_pip_env
from release.util.wheel_diff import wheel_differences

# Toolchain record keys that do not decide a wheel's bytes: where a tool lies, and ccache.
_NOT_COMPARED = ("_path", "ccache")


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
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008 (frozen: the manifest's defaults)
) -> RebuildResult:
    """Verifies, downloads, checks out, rebuilds and compares; the result either way.
    `build_cache` holds the toolchain (ACTIVEKV_CACHE_DIR); nothing compiled is taken from it."""
    project, version = parse_requirement(requirement)
    interpreter = _interpreter(python)
    check_workdir(workdir)
    source = git_source(source, workdir)
    if tuf_cache is not None:
        check_apart(tuf_cache, "--tuf-cache", workdir)
    trusted = TrustedIndex(tuf_url or tuf_url_for(index_url), trusted_root, tuf_cache,
                           limits=limits)  # fmt: skip
    check_apart(trusted.cache_dir, "--tuf-cache", workdir)  # the default one too
    fresh_workdir(workdir)
    statement = verified_statement(trusted, project, version, provenance_key, workdir)
    commit, epoch, recorded = build_inputs(statement)

    pinned = f"{project}=={version}"  # as parsed: nothing else of the argument reaches pip
    published = _download(index_url, pinned, interpreter, workdir / "published")
    trusted.check_file(published)
    try:
        signed = statement.subjects
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
