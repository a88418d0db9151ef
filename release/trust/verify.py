"""Verify step: what the index serves is what was signed, and it installs and imports.

First every file: the files the index lists for ``<project>==<version>`` (every file pip would
take for it, however the version is spelled) must be exactly the signed statement's subjects, no
file missing and none more; each is downloaded, hashed and compared with the statement's digest
(and its TUF target, where TUF is used). Then for each interpreter: a fresh venv; ``pip download``
of ``<project>==<version>`` from the index only (the machine's pip configuration and every
``PIP_*`` variable are kept out, so no other wheel source can answer); the downloaded file's
sha256 must equal the signed statement's subject; then ``pip install --no-index --no-deps`` of
exactly that file and an import of every module, checked to come from the venv.

:func:`verify_release` is the consumer's check (``python -m release verify --index URL
activekv==VERSION``): it needs only the index URL, the trusted TUF root and the public key of the
provenance signer. It refreshes the index's TUF metadata (rollback, freeze, expiry and wrong keys
are refused), downloads the version's signed statement as a TUF target and checks its signature,
checks the gate attestations the statement names (each a TUF target, signed by the runner key the
statement names, passed on exactly the statement's wheels, and the payload gate's naming the
statement's sdist, when it names one), then checks every file of the version (the sdist
included) and each wheel pip downloads against its TUF target and the statement before
installing. Its
arguments are checked first: a URL with credentials, a query or a fragment in it (as the
manifest refuses for an index) and a ``--python`` that is not an interpreter are refused, naming
the flag.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidSdistFilename, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from release.errors import ReleaseError, SigningError, VerifyError
from release.manifest import NetworkLimits, index_root
from release.statement import Statement
from release.trust.attestation import Attestation, check_release
from release.trust.release_version import (
    normalize_project,
    release_folder,
    same_version,
    statement_target,
    version_spellings,
)
from release.trust.served_files import check_served_files
from release.trust.sign import load_public_key, read_and_verify
from release.trust.tuf_client import TrustedIndex, refuse_credentials
from release.util.digests import sha256_file
from release.util.private_site import clean_pip_env

_PIP_TIMEOUT_S = 600.0
_OUTPUT_TAIL_CHARS = 4000

_VERSION_PROBE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
# Its answer is the last line, after a marker: a module may print when it is imported.
_PROBE_MARKER = "activekv-import-probe:"
_IMPORT_PROBE = f"""
import importlib, json, sys
found = {{}}
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    found[name] = getattr(module, "__file__", None)
print("\\n{_PROBE_MARKER}" + json.dumps({{"prefix": sys.prefix, "modules": found}}))
"""


@dataclass(frozen=True)
class InstallCheck:
    interpreter: Path
    python_version: str
    wheel: str
    sha256: str
    digest_ok: bool
    imported: tuple[str, ...]


@dataclass(frozen=True)
class Verification:
    """What a verification checked: every file the index serves for the version (name to
    sha256, each the statement's and, with TUF, its target's), then each interpreter's install."""

    files: dict[str, str]
    checks: tuple[InstallCheck, ...]


def verify_from_index(
    *,
    simple_url: str,
    project: str,
    version: str,
    statement: Statement,
    interpreters: Sequence[Path],
    imports: Sequence[str],
    workdir: Path,
    file_check: Callable[[Path], None] | None = None,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
) -> Verification:
    """Check every file the index serves for ``project==version`` against the statement, then
    download, check, install and import it once per interpreter.

    ``file_check`` (e.g. :meth:`TrustedIndex.check_file`) judges each downloaded file first;
    ``limits`` bound every read of the index (pip's own reads have its timeouts).
    """
    if not interpreters:
        raise VerifyError("no interpreters to verify with")
    try:
        signed = statement.subjects
    except ReleaseError as exc:
        raise VerifyError(f"the signed statement cannot be read: {exc}") from None
    files = check_served_files(
        simple_url=simple_url, project=project, version=version, signed=signed,
        folder=workdir / "served", file_check=file_check, limits=limits,
    )  # fmt: skip
    env = clean_pip_env()
    checks = []
    for number, interpreter in enumerate(interpreters):
        checks.append(
            _verify_one(
                interpreter,
                workdir / f"py{number}",
                simple_url=simple_url,
                requirement=f"{project}=={version}",
                signed=signed,
                imports=imports,
                env=env,
                file_check=file_check,
            )
        )
    return Verification(files, tuple(checks))


def parse_requirement(text: str) -> tuple[str, str]:
    """``name==version`` to (normalised name, version); VerifyError naming the argument else.

    Exactly one pin: one ``==`` specifier of a PEP 440 version (no wildcard), no other
    specifier, no environment marker, no extras, no URL, nothing pip would read as an option."""
    if not text.isprintable():
        _bad_requirement(text, "a control character (a newline?)")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as error:
        _bad_requirement(text, f"what pip cannot read as one ({str(error).splitlines()[0]})")
    for label, value in (
        ("a marker", requirement.marker),
        ("extras", requirement.extras),
        ("a URL", requirement.url),
    ):
        if value:
            _bad_requirement(text, f"{label} as well")
    specifiers = list(requirement.specifier)
    if len(specifiers) != 1 or specifiers[0].operator != "==":
        given = str(requirement.specifier)
        _bad_requirement(text, f"the version specifiers {given!r}" if given else "no version")
    try:
        version = Version(specifiers[0].version)
    except InvalidVersion:
        _bad_requirement(text, f"{specifiers[0].version!r}, which is not one version")
    return normalize_project(requirement.name), str(version)


def _bad_requirement(text: str, got: str) -> NoReturn:
    raise VerifyError(
        f"requirement {text!r}: expected exactly one pinned version, NAME==VERSION "
        f"(e.g. activekv==0.1.0); got {got}"
    )


def tuf_url_for(index_url: str) -> str:
    """The TUF repository beside a pip index URL: ``…/simple/`` becomes ``…/tuf/``."""
    refuse_credentials("--index", index_url)
    root = index_root(index_url)
    if root is not None:
        return root + "tuf/"
    raise VerifyError(
        f"--index {index_url}: cannot tell where its TUF repository is (expected a URL ending "
        "in /simple/); give --tuf-url"
    )


def verify_release(
    *,
    index_url: str,
    requirement: str,
    trusted_root: Path,
    provenance_key: Path,
    interpreters: Sequence[Path],
    imports: Sequence[str],
    workdir: Path,
    tuf_url: str | None = None,
    cache_dir: Path | None = None,
    limits: NetworkLimits = NetworkLimits(),  # noqa: B008
) -> Verification:
    """The consumer's verification of ``requirement`` on the index at ``index_url``; ``limits``
    bound every read of the index and the TUF server."""
    project, version = parse_requirement(requirement)
    refuse_credentials("--index", index_url)
    if tuf_url is not None:
        refuse_credentials("--tuf-url", tuf_url)
    for interpreter in interpreters:
        check_interpreter(interpreter)
    trusted = TrustedIndex(tuf_url or tuf_url_for(index_url), trusted_root, cache_dir,
                           limits=limits)  # fmt: skip
    statement = verified_statement(trusted, project, version, provenance_key, workdir)
    verify_attestations(statement, trusted, project, version, workdir)
    return verify_from_index(
        simple_url=index_url, project=project, version=version, statement=statement,
        interpreters=interpreters, imports=imports, workdir=workdir,
        file_check=trusted.check_file, limits=limits,
    )  # fmt: skip


def verified_statement(
    trusted: TrustedIndex, project: str, version: str, provenance_key: Path, workdir: Path
) -> Statement:
    """The release's signed statement: TUF metadata refreshed, the statement fetched as a TUF
    target, its signature checked with ``provenance_key``, its version the one asked for."""
    try:
        public_key = load_public_key(provenance_key)
    except SigningError as exc:
        raise VerifyError(f"--provenance-key: expected the provenance signer's public key "
                          f"(<channel>-signing-key.pub.json); {exc}") from None  # fmt: skip
    trusted.refresh()
    target = statement_target(project, published_version(trusted, project, version))
    statement_path = trusted.download(
        target,
        workdir / "provenance" / target.rsplit("/", 1)[-1],
        unknown=f"{project} {version} is not published there (its publisher signed no statement "
        "for that version)",
    )
    try:
        statement = read_and_verify(statement_path, public_key).statement
    except ReleaseError as exc:
        raise VerifyError(f"the signed statement {target}: {exc}") from None
    signed_version = statement.version
    if not same_version(signed_version, version):
        raise VerifyError(
            f"the signed statement {target} is for version {signed_version!r}, not {version!r}"
        )
    return statement


def published_version(trusted: TrustedIndex, project: str, version: str) -> str:
    """``version`` as its publisher spelled it in the TUF targets (``0.1.0`` for ``0.1``: the
    same version to pip and to publish); ``version`` itself where none is a target."""
    for spelled in version_spellings(version):
        if trusted.has_target(statement_target(project, spelled)):
            return spelled
    return version


def verify_attestations(
    statement: Statement, trusted: TrustedIndex, project: str, version: str, workdir: Path
) -> list[Attestation]:
    """The gate attestations the verified statement rests on, each fetched as a TUF target and
    checked (release/trust/attestation.py: check_release) against the statement's wheels, which
    is what gates judge; then each other subject (the sdist) must be named, with its digest, by
    one of them that passed (the payload gate's figures). VerifyError says which fails."""
    version = published_version(trusted, project, version)
    folder = workdir / "provenance" / release_folder(normalize_project(project), version)

    def fetch(target: str) -> Path:
        unknown = "the signed provenance names an attestation its publisher did not publish"
        return trusted.download(target, folder / target.rsplit("/", 1)[-1], unknown=unknown)

    try:
        wheels, others = _split_subjects(statement)
        checked = check_release(statement, fetch, normalize_project(project), version, wheels)
    except SigningError as exc:
        raise VerifyError(f"the gate attestations of {project} {version}: {exc}") from None
    for name, digest in sorted(others.items()):
        if not any(a.evidence.judged_sdist == {name: digest} for a in checked):
            raise VerifyError(
                f"the gate attestations of {project} {version}: the signed statement names "
                f"{name} (sha256 {digest}), which no attestation it rests on judged (the payload "
                "gate's names the sdist it judged); expected one"
            )
    return checked


def _split_subjects(statement: Statement) -> tuple[dict[str, str], dict[str, str]]:
    """The statement's wheel subjects and every other subject (name to sha256): an sdist, or
    SigningError naming what else it is."""
    subjects = statement.subjects
    others = {name: digest for name, digest in subjects.items() if not name.endswith(".whl")}
    for name in others:
        try:
            parse_sdist_filename(name)
        except InvalidSdistFilename:
            raise SigningError(f"the signed statement names {name}: expected only wheels and "
                               "an sdist (<name>-<version>.tar.gz)") from None  # fmt: skip
    return {name: digest for name, digest in subjects.items() if name not in others}, others


def check_interpreter(interpreter: Path) -> None:
    """VerifyError naming ``--python`` unless ``interpreter`` runs as a Python interpreter."""
    expected = f"--python {interpreter}: expected an executable Python interpreter; got"
    try:
        result = subprocess.run([str(interpreter), "-I", "-c", _VERSION_PROBE], env=clean_pip_env(),
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=60, check=False)  # fmt: skip
    except OSError as exc:
        got = "a folder" if interpreter.is_dir() else (exc.strerror or str(exc)).lower()
        raise VerifyError(f"{expected} {got}") from None
    except subprocess.TimeoutExpired:
        raise VerifyError(f"{expected} a program that did not answer in 60 s") from None
    if result.returncode != 0:
        raise VerifyError(f"{expected} a program that exits with status {result.returncode} "
                          "when asked its version")  # fmt: skip
    if not re.fullmatch(r"3\.\d+\.\d+", result.stdout.strip()):
        raise VerifyError(f"{expected} a program that answers {result.stdout.strip()[:60]!r} "
                          "when asked its Python version")  # fmt: skip


def _verify_one(
    interpreter: Path,
    root: Path,
    *,
    simple_url: str,
    requirement: str,
    signed: Mapping[str, str],
    imports: Sequence[str],
    env: Mapping[str, str],
    file_check: Callable[[Path], None] | None,
) -> InstallCheck:
    if root.exists():
        shutil.rmtree(root)
    venv, downloads, scratch = root / "venv", root / "downloads", root / "cwd"
    for directory in (downloads, scratch):
        directory.mkdir(parents=True)
    _run([str(interpreter), "-m", "venv", str(venv)], env, scratch, f"venv with {interpreter}")
    python = str(venv / "bin" / "python")
    version = _run([python, "-I", "-c", _VERSION_PROBE], env, scratch, "version probe").strip()
    who = f"{interpreter} (Python {version})"

    download = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    download += ["--index-url", simple_url, "-d", str(downloads), requirement]
    _run(download, env, scratch, f"pip download of {requirement} from {simple_url} for {who}")
    fetched = sorted(downloads.iterdir())
    if len(fetched) != 1 or fetched[0].suffix != ".whl":
        names = ", ".join(p.name for p in fetched) or "nothing"
        raise VerifyError(f"pip download of {requirement} for {who} gave {names}, not one wheel")
    wheel = fetched[0]
    if file_check is not None:
        file_check(wheel)
    actual = sha256_file(wheel)
    if wheel.name not in signed:
        raise VerifyError(
            f"{wheel.name} (sha256 {actual}), served by {simple_url} for {who}, is not in the "
            f"signed statement (it names: {', '.join(sorted(signed)) or 'nothing'})"
        )
    if signed[wheel.name] != actual:
        raise VerifyError(
            f"{wheel.name} served by {simple_url} has sha256 {actual}; "
            f"the signed statement expects {signed[wheel.name]}"
        )

    install = [python, "-m", "pip", "install", "--no-index", "--no-deps", str(wheel)]
    _run(install, env, scratch, f"pip install of {wheel.name} into {venv}")
    probe = [python, "-I", "-c", _IMPORT_PROBE, *imports]
    what = f"importing {', '.join(imports)} from {wheel.name} with {who}"
    output = _run(probe, env, scratch, what)
    answer = output.rpartition(_PROBE_MARKER)[2]
    try:
        report = json.loads(answer)
    except json.JSONDecodeError:
        raise VerifyError(
            f"{what}: expected the import probe's answer; got {output[-300:]!r}"
        ) from None
    prefix = Path(report["prefix"]).resolve()
    for name, location in report["modules"].items():
        if location is not None and not Path(location).resolve().is_relative_to(prefix):
            raise VerifyError(
                f"{name} was imported from {location}, not from the venv {prefix} "
                f"that {wheel.name} was installed into"
            )
    return InstallCheck(
        interpreter=interpreter,
        python_version=version,
        wheel=wheel.name,
        sha256=actual,
        digest_ok=True,
        imported=tuple(imports),
    )


def _run(command: list[str], env: Mapping[str, str], cwd: Path, what: str) -> str:
    try:
        result = subprocess.run(
            command,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_PIP_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise VerifyError(f"{what}: {command[0]} does not exist") from None
    except OSError as exc:  # a folder, a file that is not executable, another platform's binary
        raise VerifyError(f"{what}: cannot run {command[0]} ({exc.strerror or exc})") from None
    except subprocess.TimeoutExpired:
        raise VerifyError(f"{what}: did not finish in {_PIP_TIMEOUT_S:.0f} s") from None
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip())[-_OUTPUT_TAIL_CHARS:]
        raise VerifyError(f"{what} failed with status {result.returncode}:\n{output}")
    return result.stdout
