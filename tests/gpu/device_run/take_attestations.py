"""Takes what `gpu_run.sh attest` brought back into the checkout, on the workstation: the GPU
gates' attestations of this commit's wheels and the runner key that signed them.

    python tests/gpu/device_run/take_attestations.py RESULTS.tar.gz

Checked before anything is written: the carry (.activekv/gpu-carry) holds the wheels a clone
of HEAD builds; each attestation verifies with the public key that came back; each gate passed on
exactly the carry's wheels (every one, by digest). Then the attestations and the run's log go to
the manifest's attestation folder as `<gate>-<abi3 digest[:12]>.intoto.json` (the gates' older
attestations there are removed: they name wheels no commit builds), the public key beside the
manifest, and every channel with GPU attesters lists that key instead of the old one (tomlkit
keeps the manifest's comments; the edit is loaded before it replaces the file). Commit the result.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import NoReturn

import tomlkit

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the checkout's release package

from release.manifest import Manifest, load_manifest  # noqa: E402
from release.statement import attested_gate  # noqa: E402
from release.trust.attestation import read_attestation  # noqa: E402
from release.trust.sign import load_public_key  # noqa: E402
from release.util.atomic import atomic_write  # noqa: E402
from release.util.digests import sha256_file  # noqa: E402

MANIFEST = ROOT / "manifests" / "activekv.toml"
CARRY = ROOT / ".activekv" / "gpu-carry"


def _fail(message: str) -> NoReturn:
    raise SystemExit(f"take_attestations: {message}")


def _head_wheels() -> dict[str, str]:
    """HEAD's wheels by name and sha256, built in a clone of HEAD (the wheel cache makes it quick
    when the carry was built from the same sources), after checking the carry holds the same."""
    with tempfile.TemporaryDirectory() as work:
        clone, out = Path(work) / "clone", Path(work) / "out"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        env = {**os.environ, "ACTIVEKV_CACHE_DIR": str(ROOT / ".activekv" / "cache")}
        subprocess.run([sys.executable, "-m", "release", "build", "--out", str(out),
                        "--state-dir", ".activekv"], cwd=clone, env=env, check=True)  # fmt: skip
        head = {path.name: sha256_file(path) for path in sorted(out.glob("wheels/*.whl"))}
    carried = {path.name: sha256_file(path) for path in sorted(CARRY.glob("activekv-*.whl"))}
    if carried != head:
        _fail(f"{CARRY}: expected HEAD's wheels {head}; got {carried} (prepare_carry.sh "
              "--attest again, and carry that)")  # fmt: skip
    return head


def _gpu_gates() -> list[str]:
    return [name for name, spec in load_manifest(MANIFEST).gates.items() if spec.runner == "gpu"]


def _attestation_folder(manifest: Manifest) -> Path:
    """The first attestation folder of the channels with GPU attesters (they share it here)."""
    for channel in manifest.release.channels.values():
        if "gpu" in channel.attesters and channel.attestations:
            return (ROOT / channel.attestations[0]).resolve()
    _fail(
        f"{MANIFEST}: release.channels: expected a channel with GPU attesters and an "
        "attestation folder; found none"
    )


def take(results: Path) -> None:
    wheels = _head_wheels()
    manifest = load_manifest(MANIFEST)
    with tempfile.TemporaryDirectory() as unpacked:
        with tarfile.open(results) as tar:
            tar.extractall(unpacked, filter="data")
        work = Path(unpacked)
        keys = sorted(work.glob("*.pub.json"))
        if len(keys) != 1:
            _fail(f"{results}: expected one runner public key (*.pub.json); got {len(keys)}")
        key = load_public_key(keys[0])
        taken: dict[str, Path] = {}
        for gate in _gpu_gates():
            path = work / "gates" / "evidence" / f"{gate}.intoto.json"
            if not path.is_file():
                _fail(f"{results}: gates/evidence/{gate}.intoto.json: expected it; not there")
            attestation = read_attestation(path, {key.keyid: key}, str(keys[0].name))
            evidence = attestation.evidence
            if evidence.verdict != "pass":
                _fail(f"{path.name}: expected a pass; got {evidence.verdict}: {evidence.reason}")
            if dict(evidence.artefacts) != wheels:
                _fail(f"{path.name}: expected exactly the carry's wheels {wheels}; "
                      f"got {dict(evidence.artefacts)}")  # fmt: skip
            taken[gate] = path
        log = work / "gpu-gates.log"
        abi3 = next(digest for name, digest in wheels.items() if "-abi3-" in name)[:12]
        folder = _attestation_folder(manifest)
        for old in folder.glob("*.intoto.json"):
            if attested_gate(old) in taken:
                old.unlink()
        for gate, path in taken.items():
            atomic_write(folder / f"{gate}-{abi3}.intoto.json", path.read_bytes())
        if log.is_file():
            atomic_write(folder / f"gpu-gates-{abi3}.log", log.read_bytes())
        _pin_runner_key(keys[0])
    print(f"taken: {', '.join(taken)} for {len(wheels)} wheels (abi3 {abi3}…), "
          f"runner key {keys[0].name}")  # fmt: skip


def _pin_runner_key(public: Path) -> None:
    """The key beside the manifest, listed as the GPU attester of each channel that has one; the
    keys it replaces are removed when no channel lists them any more."""
    document = tomlkit.parse(MANIFEST.read_text())
    listed = f"keys/{public.name}"
    replaced: set[str] = set()
    for channel in document["release"]["channels"].values():
        attesters = channel.get("attesters")
        if attesters is not None and "gpu" in attesters:
            replaced |= set(attesters["gpu"])
            attesters["gpu"] = [listed]
    atomic_write(MANIFEST.parent / listed, public.read_bytes())
    edited = MANIFEST.with_name(MANIFEST.name + ".edited")
    edited.write_text(tomlkit.dumps(document))
    try:
        load_manifest(edited)
    except Exception:
        edited.unlink()
        raise
    edited.replace(MANIFEST)
    for old in replaced - {listed}:
        (MANIFEST.parent / old).unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    take(Path(sys.argv[1]))
