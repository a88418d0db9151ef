"""Signed provenance and gated output directories, for tests of the sign, publish and verify
steps."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from fixtures_wheels import build_wheel, wheel_set

from release import records
from release.builder.record_build import record_build
from release.evidence import SDIST_FIGURE, Evidence, write_evidence
from release.manifest import load_manifest
from release.trust.attestation import attest
from release.trust.sign import build_statement, load_signer, sign_statement, write_envelope
from release.util.digests import sha256_file
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT


def signed_envelope(wheels: list[Path], state_dir: Path, out: Path, version: str = "0.1.0") -> Path:
    """A real signed envelope over ``wheels`` (dev key generated under ``state_dir``)."""
    signer, _ = load_signer("generate", channel="dev", state_dir=state_dir)
    started = datetime.now(timezone.utc)
    statement = build_statement(
        wheels, version=version, channel="dev", manifest_path=Path("manifests/activekv.toml"),
        manifest_sha256="0" * 64, source_commit=None, source_date_epoch=1_700_000_000,
        toolchain={"python": "3"}, started=started, finished=started + timedelta(seconds=1),
    )  # fmt: skip
    write_envelope(sign_statement(statement, signer), out)
    return out


def gated_out(
    out: Path, tags: Sequence[str], version: str, state_dir: Path, salt: str = ""
) -> tuple[list[Path], dict[str, str]]:
    """``out`` as the build and the dev channel's gates leave it: one fixture wheel per tag,
    passing evidence of every required gate, attested with the dev key of ``state_dir``, and the
    build record. The wheels and their digests."""
    wheels = [build_wheel(out / "wheels", version=version, tag=tag, salt=salt) for tag in tags]
    digests = attest_passing_gates(out, wheels, state_dir)
    records.write(out, record_build(wheel_set(*wheels), REPO_ROOT))
    return wheels, digests


def attest_passing_gates(
    out: Path, wheels: Sequence[Path], state_dir: Path, sdist: Path | None = None
) -> dict[str, str]:
    """Passing evidence of every gate the dev channel requires over ``wheels``, attested with the
    dev key of ``state_dir`` (for tests of what comes after the gates); the wheels' digests. The
    payload gate's names the sdist too: ``sdist``, else the one the build record of ``out``
    names, if any (as the real gate judges the build's sdist)."""
    digests = {wheel.name: sha256_file(wheel) for wheel in wheels}
    if sdist is None:
        record = records.read_optional(out, records.BuildRecord)
        if record is not None and record.sdist is not None:
            sdist = out / records.SDIST_FOLDER / record.sdist.file
    judged = {} if sdist is None else {
        SDIST_FIGURE: {"file": sdist.name, "sha256": sha256_file(sdist), "problems": []}
    }  # fmt: skip
    signer, _ = load_signer("generate", channel="dev", state_dir=state_dir)
    for gate in load_manifest(DEFAULT_MANIFEST).channel("dev").requires:
        figures = judged if gate == "payload" else {}
        evidence = Evidence(gate=gate, verdict="pass", artefacts=digests, figures=figures)
        write_evidence(out, evidence)
        attest(evidence, signer, out)
    return digests


TAGS = ("cp310-cp310-manylinux_2_28_x86_64", "cp311-cp311-manylinux_2_28_x86_64",
        "cp312-abi3-manylinux_2_28_x86_64")  # fmt: skip


def signed_out_dir(root: Path, version: str) -> tuple[Path, Path, list[Path]]:
    """(out, state, wheels): an output directory as the gates and `python -m release sign`
    leave it, for one fixture wheel per tag of TAGS."""
    out, state = root / "out", root / "state"
    wheels, _ = gated_out(out, TAGS, version, state)
    signed = subprocess.run(
        [sys.executable, "-m", "release", "sign", "--out", str(out), "--state-dir", str(state)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert signed.returncode == 0, signed.stdout + signed.stderr
    (out / "sign-output.txt").write_text(signed.stdout + signed.stderr)  # scanned for key bytes
    return out, state, wheels
