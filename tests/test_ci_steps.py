"""The generated release job's own shell steps, run with bash as GitHub runs them (`bash -e -o
pipefail`): the key step turns the repository's secrets into the key folder the pipeline takes
(or fails naming the missing secret, writing nothing), the runner-folder step names a folder the
runner does not set, and the consumer verify finds an interpreter of every declared version; the
GPU job's records reach the release job as packed, and one edited between them is refused."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from release import ci_workflow
from release.errors import SigningError
from release.manifest import load_manifest
from release.trust.attestation import GateKeys, choose, read_attestation
from release.trust.keys import channel_signing_spec, make_channel_keys, tuf_keys_spec
from release.trust.sign import load_public_key, load_signer
from release.util.pins import project_version
from tests.ci_manifests import REAL, ROOT


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


# --- the GPU records between the GPU job and the release job ---


def _gpu_step(workflow: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [s for s in workflow["jobs"]["gpu-gates"]["steps"] if s.get("name", "") == name]
    return found


def _records_through_the_jobs(
    committed: dict[str, Any], tmp_path: Path, edit: Callable[[Path], None]
) -> Path:
    """The committed GPU attestations packed by the GPU job's step, changed by `edit` on their
    way (in an artifact store, or carried by a person), then unpacked by the release job's step:
    the release job's out/evidence."""
    gpu, carried, release = tmp_path / "gpu", tmp_path / "carried", tmp_path / "release"
    (gpu / "out" / "evidence").mkdir(parents=True)
    for gate in GPU_GATES:
        (committed_file,) = (ROOT / "tests" / "gpu" / "evidence").glob(f"{gate}-*.intoto.json")
        shutil.copy(committed_file, gpu / "out" / "evidence" / f"{gate}.intoto.json")
    packed = bash(_gpu_step(committed, "pack the GPU records")["run"], {}, cwd=gpu)
    assert packed.returncode == 0, packed.stderr
    with tarfile.open(gpu / "gpu-records.tar") as tar:
        tar.extractall(carried, filter="data")
    edit(carried)
    release.mkdir()
    with tarfile.open(release / "gpu-records.tar", "w") as tar:
        tar.add(carried / "evidence", "evidence")
    unpacked = bash(step(committed, "unpack the GPU records")["run"], {}, cwd=release)
    assert unpacked.returncode == 0, unpacked.stderr
    return release / "out" / "evidence"


def _choose_gpu(evidence: Path) -> tuple[dict[str, Any], list[str]]:
    """What the release job's sign takes for the GPU gates: by the manifest's pinned runner key,
    on the digests the committed attestations name."""
    manifest = load_manifest(REAL)
    keys = {}
    for listed in manifest.channel("stable").attesters["gpu"]:
        key = load_public_key(REAL.parent / listed)
        keys[key.keyid] = key
    (committed_file,) = (ROOT / "tests" / "gpu" / "evidence").glob("warmup-*.intoto.json")
    digests = dict(read_attestation(committed_file, keys, "gpu").evidence.artefacts)
    gates = [GateKeys(gate, keys, "attesters.gpu") for gate in GPU_GATES]
    return choose(gates, [evidence], digests)


GPU_GATES = ("warmup", "gpu-parity")


def test_the_gpu_records_reach_the_release_job_as_the_gpu_job_packed_them(
    committed: dict[str, Any], tmp_path: Path
) -> None:
    evidence = _records_through_the_jobs(committed, tmp_path, lambda carried: None)
    chosen, problems = _choose_gpu(evidence)
    assert problems == [] and sorted(chosen) == sorted(GPU_GATES)


def test_a_gpu_record_edited_between_the_jobs_makes_the_release_job_refuse(
    committed: dict[str, Any], tmp_path: Path
) -> None:
    """Negative control: the warm-up verdict's attestation edited in the carried archive (its
    signature kept) is refused by itself, naming the file, although the committed copy in
    tests/gpu/evidence would still verify."""

    def edit(carried: Path) -> None:
        path = carried / "evidence" / "warmup.intoto.json"
        document = json.loads(path.read_text())
        statement = json.loads(base64.b64decode(document["payload"]))
        statement["predicate"]["reason"] = "edited on its way"
        document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        path.write_text(json.dumps(document))

    evidence = _records_through_the_jobs(committed, tmp_path, edit)
    with pytest.raises(SigningError, match="does not verify") as raised:
        _choose_gpu(evidence)
    assert str(evidence / "warmup.intoto.json") in str(raised.value)
