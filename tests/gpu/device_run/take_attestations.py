"""Takes what `gpu_run.sh attest` brought back into the checkout, on the workstation: the GPU
gates' attestations of this commit's wheels and the runner key that signed them.

    python tests/gpu/device_run/take_attestations.py RESULTS.tar.gz
    python tests/gpu/device_run/take_attestations.py --pin RUNNER.pub.json   (in a checkout:
        only pins that key; gpu_run.sh replay does it there)

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
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import tomlkit

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the checkout's release package

from release.errors import ReleaseError  # noqa: E402
from release.manifest import Manifest, load_manifest  # noqa: E402
from release.statement import attested_gate  # noqa: E402
from release.trust.attestation import read_attestation  # noqa: E402
from release.trust.sign import load_public_key  # noqa: E402
from release.util.atomic import atomic_write  # noqa: E402
from release.util.digests import sha256_file  # noqa: E402

MANIFEST = Path("manifests") / "activekv.toml"  # in the checkout
CARRY = Path(".activekv") / "gpu-carry"


class TakeError(Exception):
    """What is wrong with the results or the carry, in one line; nothing was written."""


def head_wheels(root: Path = ROOT) -> dict[str, str]:
    """HEAD's wheels by name and sha256, built in a clone of HEAD (the wheel cache makes it quick
    when the carry was built from the same sources), after checking the carry holds the same."""
    with tempfile.TemporaryDirectory() as work:
        clone, out = Path(work) / "clone", Path(work) / "out"
        subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True)
        env = {**os.environ, "ACTIVEKV_CACHE_DIR": str(root / ".activekv" / "cache")}
        subprocess.run([sys.executable, "-m", "release", "build", "--out", str(out),
                        "--state-dir", ".activekv"], cwd=clone, env=env, check=True)  # fmt: skip
        head = {path.name: sha256_file(path) for path in sorted(out.glob("wheels/*.whl"))}
    carry = root / CARRY  # the wheels, or the wheels job's artifacts (prepare_carry --replay)
    carried = {path.name: sha256_file(path) for path in sorted(carry.rglob("activekv-*.whl"))}
    if carried != head:
        raise TakeError(f"{carry}: expected HEAD's wheels {head}; got {carried} "
                        "(prepare_carry.sh --attest again, and carry that)")  # fmt: skip
    return head


def _attestation_folder(manifest: Manifest, root: Path) -> Path:
    """The first attestation folder of the channels with GPU attesters (they share it here)."""
    for channel in manifest.release.channels.values():
        if "gpu" in channel.attesters and channel.attestations:
            return root / channel.attestations[0]
    raise TakeError(f"{root / MANIFEST}: release.channels: expected a channel with GPU "
                    "attesters and an attestation folder; found none")  # fmt: skip


def _checked(
    results: Path, work: Path, wheels: dict[str, str], gates: list[str]
) -> tuple[Path, dict[str, Path]]:
    """(the runner's public key file, each GPU gate's attestation) from the unpacked `work`,
    once each verifies with that key and passed on exactly `wheels`."""
    keys = sorted(work.glob("*.pub.json"))
    if len(keys) != 1:
        raise TakeError(f"{results}: expected one runner public key (*.pub.json); "
                        f"got {len(keys)}")  # fmt: skip
    key = load_public_key(keys[0])
    taken: dict[str, Path] = {}
    for gate in gates:
        path = work / "gates" / "evidence" / f"{gate}.intoto.json"
        if not path.is_file():
            raise TakeError(f"{results}: gates/evidence/{gate}.intoto.json: expected it; "
                            "not there")  # fmt: skip
        try:
            evidence = read_attestation(path, {key.keyid: key}, keys[0].name).evidence
        except ReleaseError as error:
            raise TakeError(f"{results}: {error}") from None
        if evidence.verdict != "pass":
            raise TakeError(f"{results}: {path.name}: expected a pass; got {evidence.verdict}: "
                            f"{evidence.reason}")  # fmt: skip
        if dict(evidence.artefacts) != wheels:
            raise TakeError(f"{results}: {path.name}: expected exactly the wheels {wheels}; "
                            f"got {dict(evidence.artefacts)}")  # fmt: skip
        taken[gate] = path
    return keys[0], taken


def take(results: Path, wheels: dict[str, str], root: Path = ROOT) -> str:
    """Checks everything first (TakeError, nothing written), then writes; a line saying what."""
    manifest_path = root / MANIFEST
    manifest = load_manifest(manifest_path)
    gates = [name for name, spec in manifest.gates.items() if spec.runner == "gpu"]
    abi3 = [digest for name, digest in wheels.items() if "-abi3-" in name]
    if len(abi3) != 1:
        raise TakeError(f"expected one stable-ABI wheel among {sorted(wheels)}")
    folder = _attestation_folder(manifest, root)
    with tempfile.TemporaryDirectory() as unpacked:
        try:
            with tarfile.open(results) as tar:
                tar.extractall(unpacked, filter="data")
        except (OSError, tarfile.TarError) as error:
            raise TakeError(f"{results}: expected the tar.gz gpu_run.sh packs; {error}") from None
        public, taken = _checked(results, Path(unpacked), wheels, gates)
        document = _pinned(manifest_path, public)
        stale = [old for old in folder.glob("*.intoto.json") if attested_gate(old) in taken]
        for old in stale:
            old.unlink()
        for gate, path in taken.items():
            atomic_write(folder / f"{gate}-{abi3[0][:12]}.intoto.json", path.read_bytes())
        log = Path(unpacked) / "gpu-gates.log"
        if log.is_file():
            atomic_write(folder / f"gpu-gates-{abi3[0][:12]}.log", log.read_bytes())
        _write_pinned(manifest_path, public, document)
    return (f"taken: {', '.join(taken)} for {len(wheels)} wheels (abi3 {abi3[0][:12]}…), "
            f"runner key {public.name}")  # fmt: skip


def _pinned(manifest_path: Path, public: Path) -> tuple[str, set[str]]:
    """The manifest with `public` as the GPU attester of each channel that has one, checked by
    loading it beside the key; and the key files it no longer lists."""
    document = tomlkit.parse(manifest_path.read_text())
    listed = f"keys/{public.name}"
    replaced: set[str] = set()
    for channel in document["release"]["channels"].values():
        attesters = channel.get("attesters")
        if attesters is not None and "gpu" in attesters:
            replaced |= set(attesters["gpu"])
            attesters["gpu"] = [listed]
    text = tomlkit.dumps(document)
    with tempfile.TemporaryDirectory() as check:
        shutil.copytree(manifest_path.parent, Path(check), dirs_exist_ok=True)
        shutil.copy2(public, Path(check) / listed)
        (Path(check) / manifest_path.name).write_text(text)
        load_manifest(Path(check) / manifest_path.name)
    return text, replaced - {listed}


def _write_pinned(manifest_path: Path, public: Path, pinned: tuple[str, set[str]]) -> None:
    text, unlisted = pinned
    atomic_write(manifest_path.parent / "keys" / public.name, public.read_bytes())
    atomic_write(manifest_path, text.encode())
    for old in unlisted:
        (manifest_path.parent / old).unlink(missing_ok=True)


def pin(public: Path, root: Path = ROOT) -> str:
    """`public` (a runner's key file) as the GPU attester of every channel that has one, the
    old key files removed: what `gpu_run.sh replay` commits there before the GPU job runs."""
    load_public_key(public)  # a key file, or ReleaseError naming it
    manifest_path = root / MANIFEST
    _write_pinned(manifest_path, public, _pinned(manifest_path, public))
    return f"pinned: {public.name} as the gpu attester in {manifest_path}"


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if len(arguments) not in (1, 2) or (len(arguments) == 2 and arguments[0] != "--pin"):
        raise SystemExit(__doc__)
    try:
        if arguments[0] == "--pin":
            print(pin(Path(arguments[1]).resolve()))
        else:
            print(take(Path(arguments[0]), head_wheels()))
    except (TakeError, ReleaseError) as error:
        raise SystemExit(f"take_attestations: {error}") from None
