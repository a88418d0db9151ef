"""The generated release job's own shell steps, run with bash as GitHub runs them (`bash -e -o
pipefail`): the key step turns the repository's secrets into the key folder the pipeline takes
(or fails naming the missing secret, writing nothing), the runner-folder step names a folder the
runner does not set, and the consumer verify finds an interpreter of every declared version."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from release import ci_workflow
from release.manifest import load_manifest
from release.trust.keys import channel_signing_spec, make_channel_keys, tuf_keys_spec
from release.trust.sign import load_signer
from release.util.pins import project_version
from tests.ci_manifests import REAL, ROOT


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    return ci_workflow.generate(load_manifest(REAL))


def step(workflow: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [s for s in workflow["jobs"]["release"]["steps"] if s.get("name", "") == name]
    return found


def bash(script: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                          env={**base, **env}, cwd=cwd, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


KEY_STEP = "the stable channel's keys, from the repository's secrets"


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The stable keys as keygen makes them, each PEM's text under its secret's name."""
    folder = tmp_path_factory.mktemp("operator") / "keys"
    keys = make_channel_keys("stable", folder)
    names = ci_workflow.secret_names("stable")
    values = {secret: (folder / f"{name}.pem").read_text() for secret, name in names.items()}
    return {"values": values, "keys": keys}


def test_the_key_step_writes_the_folder_the_pipeline_takes(
    stable_workflow: dict[str, Any], secrets: dict[str, Any], tmp_path: Path
) -> None:
    github_env = tmp_path / "github-env"
    result = bash(step(stable_workflow, KEY_STEP)["run"],
                  {"RUNNER_TEMP": str(tmp_path), "GITHUB_ENV": str(github_env),
                   **secrets["values"]})  # fmt: skip
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "activekv-keys"
    assert github_env.read_text() == f"ACTIVEKV_KEY_DIR={folder}\n"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for pem in folder.iterdir():
        assert stat.S_IMODE(pem.stat().st_mode) == 0o600, pem
    for text in secrets["values"].values():  # never printed
        assert text.splitlines()[1] not in result.stdout + result.stderr
    # --key-dir takes it: the signing key and each TUF role's, the very keys keygen made.
    state = tmp_path / "state"
    _, signing = load_signer(channel_signing_spec("stable", folder).key, channel="stable",
                             state_dir=state)  # fmt: skip
    assert signing.keyid == secrets["keys"]["signing"].keyid
    tuf = tuf_keys_spec(folder)
    for role in ("root", "targets", "snapshot", "timestamp"):
        _, key = load_signer(getattr(tuf, role).key, channel="stable", state_dir=state)
        assert key.keyid == secrets["keys"][role].keyid


def test_a_missing_secret_fails_the_key_step_naming_it_and_writes_nothing(
    stable_workflow: dict[str, Any], secrets: dict[str, Any], tmp_path: Path
) -> None:
    github_env = tmp_path / "github-env"
    given = {k: v for k, v in secrets["values"].items() if k != "ACTIVEKV_TUF_SNAPSHOT_KEY"}
    runner = {"RUNNER_TEMP": str(tmp_path), "GITHUB_ENV": str(github_env)}
    result = bash(step(stable_workflow, KEY_STEP)["run"], {**runner, **given})
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: the repository secret ACTIVEKV_TUF_SNAPSHOT_KEY is not set: it holds "
        "tuf-snapshot.pem, as `python -m release keygen --channel stable` made it"
    )
    assert not (tmp_path / "activekv-keys").exists() and not github_env.exists()


@pytest.mark.parametrize("unset", ["ACTIVEKV_STATE_DIR", "ACTIVEKV_TUF_DIR"])
def test_a_runner_folder_that_is_not_set_stops_the_job_naming_it(
    committed: dict[str, Any], unset: str
) -> None:
    script = step(committed, "the release runner's folders")["run"]
    folders = {"ACTIVEKV_STATE_DIR": "/srv/state", "ACTIVEKV_TUF_DIR": "/srv/tuf"}
    assert bash(script, folders).returncode == 0
    result = bash(script, {k: v for k, v in folders.items() if k != unset})
    assert result.returncode != 0
    assert f"{unset}: set on the release runner: the folder" in result.stderr


def _verify_prelude(committed: dict[str, Any]) -> str:
    """The consumer verify step, its `python -m release verify` line replaced by a print of
    the interpreters and the requirement it would give."""
    script = step(committed, "verify from the index, as a consumer")["run"]
    lines = script.splitlines()
    assert lines[-1].startswith("python -m release verify ")
    return "\n".join([*lines[:-1], 'printf "%s\\n" "${interpreters[@]}" "activekv==$version"'])


def test_the_consumer_verify_installs_with_every_declared_python(
    committed: dict[str, Any], tmp_path: Path
) -> None:
    manifest = load_manifest(REAL)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ["python", *(f"python{version}" for version in manifest.build.python)]:
        wrapper = bin_dir / name  # this venv's interpreter under the name setup-python gives
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
    result = bash(_verify_prelude(committed), {"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    assert printed[-1] == f"activekv=={project_version()}"
    expected = [part for v in manifest.build.python for part in ("--python", str(bin_dir /
                f"python{v}"))]  # fmt: skip
    assert printed[:-1] == expected
    # Negative control: a runner without one declared version stops the step, naming it.
    (bin_dir / f"python{manifest.build.python[-1]}").unlink()
    result = bash(_verify_prelude(committed), {"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert result.returncode == 1
    assert f"error: no python{manifest.build.python[-1]} on the release runner" in result.stderr
