"""Reuse in the real pipeline (docs/reuse.md): the casters gate on the built wheel is taken from
the store the second time and runs again when one byte of its code changes; verify's installs
from a real embedded index (pypiserver, TUF, pip into fresh venvs) are taken again for the same
files, and never where the index serves another file or other bytes, or for another
interpreter; and the signature of the same statement is taken again."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_sign import TAGS, gated_out
from fixtures_wheels import build_wheel

from release import steps
from release.context import Context
from release.errors import VerifyError
from release.gates import reuse as gate_reuse
from release.manifest import NetworkLimits, load_manifest
from release.trust import reuse as trust_reuse
from release.trust.index import EmbeddedIndex
from release.trust.reuse import signed_or_reused, verified_or_reused
from release.trust.sign import (
    key_paths,
    load_public_key,
    load_signer,
    read_and_verify,
    read_and_verify_envelope,
)
from release.trust.statement_store import envelope_path_for
from release.trust.tuf_client import TrustedIndex
from release.trust.tuf_metadata import TufRepository
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from release.util.reuse import ReuseStore
from release.util.sources import folder_sources, module_sources
from release.wheelset import WheelSet

pytestmark = pytest.mark.integration  # the built wheel; a real index, TUF and pip

USER = "activekv-publisher"


def test_the_casters_gate_is_reused_on_the_built_wheel_until_its_code_changes(
    built_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = load_manifest(DEFAULT_MANIFEST)
    context = Context(manifest, REPO_ROOT, tmp_path / "out", tmp_path / "state")
    wheels = WheelSet.from_files(manifest, [built_wheel])
    store = steps.reuse_store(context)
    root = tmp_path / "code"  # the real code, copied: one byte of it changes below
    for folder in ("release", "reference", "shims"):
        shutil.copytree(REPO_ROOT / folder, root / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    monkeypatch.setattr(gate_reuse, "module_sources", lambda m: module_sources(m, root))
    monkeypatch.setattr(gate_reuse, "folder_sources", lambda: folder_sources(root=root))

    def judge() -> steps.Judged:
        return steps.judge(context, "casters", steps.gate_inputs(context, wheels, gpu=None), store)

    first = judge()
    assert first.evidence.verdict == "pass" and first.reused == ""
    again = judge()
    assert again.reused.startswith("reused: key ") and again.evidence == first.evidence
    gate = root / "release" / "gates" / "casters.py"
    gate.write_bytes(gate.read_bytes() + b"#")
    changed = judge()
    assert changed.reused == "" and changed.evidence.time != first.evidence.time
    assert changed.ran_again == "code.release/gates/casters.py"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(out, state): the dev channel's fixture release signed and published to the embedded
    index of `state`, as `sign` and `publish` leave it."""
    root = tmp_path_factory.mktemp("reuse-verify")
    out, state = root / "out", root / "state"
    gated_out(out, TAGS, "0.1.0", state)
    for step in ("sign", "publish"):
        done = subprocess.run(
            [sys.executable, "-m", "release", step, "--out", str(out), "--state-dir", str(state)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    return out, state


def _verify(state: Path, work: Path, store: ReuseStore, interpreters: list[Path]) -> str:
    """verify's check of the index of `state`, as `run` makes it; the reuse note."""
    with EmbeddedIndex(state, USER) as index:
        root = TufRepository(index.tuf_dir).trusted_root_path
        trusted = TrustedIndex(index.tuf_url, root, state / "verify-tuf-cache")
        trusted.refresh()
        stored = envelope_path_for(index.provenance_dir, "activekv", "0.1.0")
        statement = read_and_verify(stored, load_public_key(key_paths(state, "dev")[1])).statement
        verified, note = verified_or_reused(
            index, trusted, stored, statement, channel="dev", project="activekv",
            version="0.1.0", interpreters=interpreters, imports=["activekv._probe"],
            workdir=work, limits=NetworkLimits(), reuse=store,
        )  # fmt: skip
    assert [check.interpreter for check in verified.checks] == interpreters
    return note


def test_verify_is_reused_for_the_same_files_and_never_for_other_ones(
    published: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, state = published
    # verify's code, held still: the checkout may be edited while the tests run.
    monkeypatch.setattr(trust_reuse, "module_sources", lambda modules: {"verify.py": "1"})
    store = ReuseStore(tmp_path / "reuse")
    python = [Path(sys.executable)]
    assert _verify(state, tmp_path / "v1", store, python) == ""
    assert _verify(state, tmp_path / "v2", store, python).startswith("reused: key ")
    assert not list((tmp_path / "v2").glob("py*/venv"))  # nothing installed: taken
    other = find_interpreter("3.12" if sys.version_info[:2] != (3, 12) else "3.11")
    if other is not None:
        assert _verify(state, tmp_path / "v3", store, [other]) == ""  # another interpreter
    refused = ReuseStore(tmp_path / "reuse", refused="CI is set")
    assert _verify(state, tmp_path / "v4", refused, python) == ""

    packages = state / "index" / "packages"
    extra = build_wheel(packages, tag="py3-none-any")  # the index serves one file more
    with pytest.raises(VerifyError, match=r"not a TUF target|not in the signed statement"):
        _verify(state, tmp_path / "v5", store, python)
    extra.unlink()
    served = sorted(packages.glob("*cp311*.whl"))[0]
    original = served.read_bytes()
    served.write_bytes(original + b"\0")  # the same name, other bytes
    try:
        with pytest.raises(VerifyError, match=r"does not match its TUF target|sha256"):
            _verify(state, tmp_path / "v6", store, python)
    finally:
        served.write_bytes(original)
    assert _verify(state, tmp_path / "v7", store, python).startswith("reused: key ")


def test_the_signature_of_the_same_statement_is_reused(
    published: tuple[Path, Path], tmp_path: Path
) -> None:
    out, state = published
    signer, public_key = load_signer("generate", channel="dev", state_dir=state)
    statement = read_and_verify_envelope(out / "provenance" / "activekv-0.1.0.intoto.json",
                                         public_key)  # fmt: skip
    store = ReuseStore(tmp_path / "reuse")
    envelope = tmp_path / "signed.intoto.json"
    assert signed_or_reused(statement, "dev", signer, public_key, envelope, store) == ""
    first = sha256_file(envelope)
    rerun = {
        **statement,
        "predicate": {
            **statement["predicate"],
            "runDetails": {
                **statement["predicate"]["runDetails"],
                "metadata": {"invocationId": "another run"},
            },
        },
    }
    note = signed_or_reused(rerun, "dev", signer, public_key, envelope, store)
    assert note.startswith("reused: key ") and sha256_file(envelope) == first
    other = {**statement, "subject": statement["subject"][:1]}
    assert signed_or_reused(other, "dev", signer, public_key, envelope, store) == ""
    assert read_and_verify_envelope(envelope, public_key)["subject"] == statement["subject"][:1]
