"""A platform without a wheel installs the sdist: the release's sdist, uploaded to a real embedded
index, is installed from that index alone with `pip install --no-binary activekv` (the README's
install line: `PIP_CONFIG_FILE=/dev/null`, no `PIP_*` variable, so no other source can answer)
into a fresh venv, compiled here with the host's compilers, and imported.

The embedded index serves only the project, not its build requirements: the venv is given them
first (build-system.requires, exactly as pinned, from this machine's usual pip sources) and pip
builds without isolation. A consumer of an index that mirrors PyPI needs no such step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from release.builder.sdist import StagedSdist
from release.builder.wheels import source_date_epoch
from release.trust import twine_upload
from release.trust.index import EmbeddedIndex
from release.util.paths import REPO_ROOT
from release.util.pins import pyproject
from release.util.private_site import clean_pip_env

pytestmark = pytest.mark.integration  # compiles the engine from the sdist with the host g++

MODULES = ("activekv._engine", "activekv._fabric", "activekv._vllm")
PROBE = (
    "import importlib, json, sys; from importlib.metadata import distribution; "
    "found = {m: importlib.import_module(m).__file__ for m in sys.argv[1:]}; "
    "wheel = distribution('activekv').read_text('WHEEL'); "
    "print(json.dumps({'prefix': sys.prefix, 'modules': found, 'wheel': wheel}))"
)


def _run(command: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def test_the_sdist_installs_from_the_index_with_no_binary_and_imports(tmp_path: Path) -> None:
    with StagedSdist(REPO_ROOT, tmp_path / "out", source_date_epoch(REPO_ROOT)) as staged:
        pass
    sdist = staged.built.path
    scratch = tmp_path / "cwd"  # not the checkout: nothing importable from it
    scratch.mkdir()
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    _run([sys.executable, "-m", "venv", str(venv)], dict(os.environ), scratch)
    requires = pyproject()["build-system"]["requires"]
    _run([python, "-m", "pip", "install", "--quiet", *requires], dict(os.environ), scratch)

    with EmbeddedIndex(tmp_path / "state", "activekv-publisher") as index:
        twine_upload.upload(sdist, index.url, index.username, index.password)
        env = clean_pip_env()
        assert env["PIP_CONFIG_FILE"] == os.devnull and "PIP_FIND_LINKS" not in env
        log = _run([python, "-m", "pip", "install", "--no-binary", "activekv",
                    "--no-build-isolation", "--index-url", index.simple_url, "activekv==0.1.0"],
                   env, scratch)  # fmt: skip
    assert sdist.name in log and "Building wheel for activekv" in log  # the index's sdist, built

    answer = json.loads(_run([python, "-I", "-c", PROBE, *MODULES], env, scratch).splitlines()[-1])
    prefix = Path(answer["prefix"]).resolve()
    assert prefix == venv.resolve()
    for module, location in answer["modules"].items():
        assert Path(location).resolve().is_relative_to(prefix), module
    # built here from the source, not a published manylinux wheel
    tags = [line for line in answer["wheel"].splitlines() if line.startswith("Tag: ")]
    assert tags and not any("manylinux" in tag for tag in tags), tags
