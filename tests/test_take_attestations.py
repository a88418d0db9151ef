"""tests/gpu/device_run/take_attestations.py: what a GPU run brought back is written into the
checkout only when every attestation verifies with the returned runner key and passed on exactly
the wheels; then the manifest lists that key as the GPU attester and loads. Each refusal writes
nothing."""

from __future__ import annotations

import importlib.util
import re
import shutil
import tarfile
from pathlib import Path

import pytest
from fixtures_sign import TAGS
from fixtures_wheels import build_wheel

from release.errors import ReleaseError
from release.evidence import Evidence
from release.manifest import load_manifest
from release.trust.attestation import attest
from release.trust.keys import make_runner_key
from release.trust.sign import load_signer
from release.util.digests import sha256_file
from release.util.paths import REPO_ROOT

_SPEC = importlib.util.spec_from_file_location(
    "take_attestations", REPO_ROOT / "tests" / "gpu" / "device_run" / "take_attestations.py"
)
assert _SPEC is not None and _SPEC.loader is not None
take_attestations = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(take_attestations)

GPU_GATES = ("warmup", "gpu-parity")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout's manifest folder and GPU evidence folder, copied."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / "manifests", root / "manifests")
    shutil.copytree(REPO_ROOT / "tests" / "gpu" / "evidence", root / "tests" / "gpu" / "evidence")
    return root


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, str]:
    built = [build_wheel(tmp_path / "wheels", version="0.1.0", tag=tag) for tag in TAGS]
    return {wheel.name: sha256_file(wheel) for wheel in built}


def _results(
    tmp_path: Path,
    wheels: dict[str, str],
    *,
    verdict: str = "pass",
    signed_by_other: bool = False,
    gates: tuple[str, ...] = GPU_GATES,
) -> Path:
    """What gpu_run.sh attest packs: the runner's public key and the gates' attestations."""
    work = tmp_path / "work"
    key = make_runner_key("h100-runner-test", tmp_path / "keys")
    signing = tmp_path / "keys" / "h100-runner-test.pem"
    if signed_by_other:
        make_runner_key("other", tmp_path / "keys")
        signing = tmp_path / "keys" / "other.pem"
    signer, _ = load_signer(f"file:{signing}", channel="gpu", state_dir=tmp_path / "state")
    for gate in gates:
        evidence = Evidence(gate=gate, verdict=verdict, artefacts=dict(wheels))  # type: ignore[arg-type]
        attest(evidence, signer, work / "gates")
    work.mkdir(exist_ok=True)
    shutil.copy2(tmp_path / "keys" / "h100-runner-test.pub.json", work)
    (work / "gpu-gates.log").write_text("warmup: pass\n")
    assert key.keyid
    results = tmp_path / "results.tar.gz"
    with tarfile.open(results, "w:gz") as tar:
        tar.add(work, arcname=".")
    return results


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_passing_run_is_taken_and_the_manifest_lists_its_key(
    tmp_path: Path, checkout: Path, wheels: dict[str, str]
) -> None:
    old_keys = set(load_manifest(checkout / "manifests" / "activekv.toml").release.channels[
        "stable"].attesters["gpu"])  # fmt: skip
    said = take_attestations.take(_results(tmp_path, wheels), wheels, checkout)
    abi3 = next(d for n, d in wheels.items() if "-abi3-" in n)[:12]
    evidence = checkout / "tests" / "gpu" / "evidence"
    for gate in GPU_GATES:
        assert (evidence / f"{gate}-{abi3}.intoto.json").is_file()
    assert (evidence / f"gpu-gates-{abi3}.log").read_text() == "warmup: pass\n"
    # The gates' older attestations are gone: they name wheels no commit builds.
    assert sorted(p.name for p in evidence.glob("*.intoto.json")) == sorted(
        f"{gate}-{abi3}.intoto.json" for gate in GPU_GATES
    )
    manifest = load_manifest(checkout / "manifests" / "activekv.toml")
    assert manifest.release.channels["stable"].attesters["gpu"] == (
        "keys/h100-runner-test.pub.json",
    )
    assert (checkout / "manifests" / "keys" / "h100-runner-test.pub.json").is_file()
    for old in old_keys:
        assert not (checkout / "manifests" / old).exists()
    # tomlkit kept the manifest's comments.
    assert (
        "# Whose signed gate attestations count"
        in (checkout / "manifests" / "activekv.toml").read_text()
    )
    assert "h100-runner-test.pub.json" in said


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("not-passed", "expected a pass; got fail"),
        ("other-key", "warmup.intoto.json: signed by key(s)"),
        ("other-wheels", "expected exactly the wheels"),
        ("missing-gate", "gates/evidence/gpu-parity.intoto.json: expected it; not there"),
    ],
)
def test_a_run_that_cannot_be_taken_writes_nothing(
    tmp_path: Path, checkout: Path, wheels: dict[str, str], case: str, expected: str
) -> None:
    attested = dict(wheels)
    if case == "other-wheels":
        attested[next(iter(attested))] = "0" * 64
    results = _results(
        tmp_path, attested, verdict="fail" if case == "not-passed" else "pass",
        signed_by_other=case == "other-key",
        gates=("warmup",) if case == "missing-gate" else GPU_GATES,
    )  # fmt: skip
    before = _snapshot(checkout)
    with pytest.raises(take_attestations.TakeError, match=re.escape(expected)):
        take_attestations.take(results, wheels, checkout)
    assert _snapshot(checkout) == before


def test_an_archive_that_is_not_one_is_named(
    tmp_path: Path, checkout: Path, wheels: dict[str, str]
) -> None:
    broken = tmp_path / "results.tar.gz"
    broken.write_bytes(b"not a tar")
    before = _snapshot(checkout)
    with pytest.raises(
        take_attestations.TakeError, match=re.escape("results.tar.gz: expected the tar.gz")
    ):
        take_attestations.take(broken, wheels, checkout)
    assert _snapshot(checkout) == before


def test_pin_lists_a_runner_key_alone_and_a_file_that_is_no_key_changes_nothing(
    tmp_path: Path, checkout: Path
) -> None:
    """`--pin` (gpu_run.sh replay commits it before the GPU job runs): the key becomes every GPU
    attester, the old key files go; a file that is not a public key is refused, nothing written."""
    manifest_path = checkout / "manifests" / "activekv.toml"
    old_keys = set(load_manifest(manifest_path).release.channels["stable"].attesters["gpu"])
    make_runner_key("h100-runner-new", tmp_path / "keys")
    said = take_attestations.pin(tmp_path / "keys" / "h100-runner-new.pub.json", checkout)
    manifest = load_manifest(manifest_path)
    assert manifest.release.channels["stable"].attesters["gpu"] == (
        "keys/h100-runner-new.pub.json",
    )
    for old in old_keys:
        assert not (checkout / "manifests" / old).exists()
    assert "h100-runner-new.pub.json" in said
    before = _snapshot(checkout)
    not_a_key = tmp_path / "h100-runner-bad.pub.json"
    not_a_key.write_text("{}")
    with pytest.raises(ReleaseError, match=re.escape(str(not_a_key))):
        take_attestations.pin(not_a_key, checkout)
    assert _snapshot(checkout) == before
