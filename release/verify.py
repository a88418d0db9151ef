"""Verify step: what the index serves is what was signed, and it installs and imports.

For each interpreter: a fresh venv; ``pip download`` of ``<project>==<version>`` from the index
only (the machine's pip configuration and every ``PIP_*`` variable are kept out, so no other wheel
source can answer); the downloaded file's sha256 must equal the signed statement's subject; then
``pip install --no-index --no-deps`` of exactly that file and an import of every module, checked
to come from the venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.digests import sha256_file
from release.errors import ReleaseError, VerifyError
from release.sign import subject_digests

_PIP_TIMEOUT_S = 600.0
_OUTPUT_TAIL_CHARS = 4000
# Variables that would let something other than the index, or other than the venv, answer.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "VIRTUAL_ENV")

_VERSION_PROBE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
_IMPORT_PROBE = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    found[name] = getattr(module, "__file__", None)
print(json.dumps({"prefix": sys.prefix, "modules": found}))
"""


@dataclass(frozen=True)
class InstallCheck:
    interpreter: Path
    python_version: str
    wheel: str
    sha256: str
    digest_ok: bool
    imported: tuple[str, ...]


def clean_pip_env() -> dict[str, str]:
    """The environment for pip: no ``PIP_*`` variable inherited, no pip configuration file."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in _DROPPED_ENV
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env["PIP_NO_CACHE_DIR"] = "1"  # a cached answer is not what the index serves now
    return env


def verify_from_index(
    *,
    simple_url: str,
    project: str,
    version: str,
    statement: Mapping[str, Any],
    interpreters: Sequence[Path],
    imports: Sequence[str],
    workdir: Path,
) -> list[InstallCheck]:
    """Download, check, install and import ``project==version`` once per interpreter."""
    if not interpreters:
        raise VerifyError("no interpreters to verify with")
    try:
        signed = subject_digests(statement)
    except ReleaseError as exc:
        raise VerifyError(f"the signed statement cannot be read: {exc}") from None
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
            )
        )
    return checks


def _verify_one(
    interpreter: Path,
    root: Path,
    *,
    simple_url: str,
    requirement: str,
    signed: Mapping[str, str],
    imports: Sequence[str],
    env: Mapping[str, str],
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
    report = json.loads(_run(probe, env, scratch, what))
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
    except subprocess.TimeoutExpired:
        raise VerifyError(f"{what}: did not finish in {_PIP_TIMEOUT_S:.0f} s") from None
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip())[-_OUTPUT_TAIL_CHARS:]
        raise VerifyError(f"{what} failed with status {result.returncode}:\n{output}")
    return result.stdout
