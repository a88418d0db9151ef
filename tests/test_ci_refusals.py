"""`python -m release ci` writes no workflow with a path that cannot finish a release
(release/ci/refusals.py): each refusal is planted in a copy of the real manifest, and each is one
line naming the key to change. The manifest's own [ci], and the same with stable pinned, pass."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from release import ci_workflow, cli
from release.errors import ManifestError
from release.manifest import Manifest, load_manifest
from tests.ci_manifests import REAL, ROOT, STABLE, variant_text, write_variant

HOSTED = (REAL.read_text()[REAL.read_text().index("\n[ci.release]") :], "\n")
KEYS_FROM_MANIFEST = ('keys = "secrets"', 'keys = "manifest"')
# The GPU attester the real manifest lists (a re-attested commit lists a new runner key).
GPU_ATTESTER = re.search(r'gpu = \["keys/[^"]+"\]', REAL.read_text())[0]  # type: ignore[index]
TUF_FILE_KEYS = (
    "\n[ci]\n",
    "".join(f'\n[publish.tuf_keys.{role}]\nkey = "file:/etc/activekv/tuf-{role}.pem"\n'
            for role in ("root", "targets", "snapshot", "timestamp")) + "\n[ci]\n",
)  # fmt: skip


def load(tmp_path: Path, *changes: tuple[str, str]) -> Manifest:
    return load_manifest(write_variant(tmp_path, variant_text(*changes)))


def refusal(tmp_path: Path, *changes: tuple[str, str]) -> list[str]:
    """The lines `ci` refuses the changed manifest with; each one line naming its key."""
    manifest = load(tmp_path, *changes)
    with pytest.raises(ManifestError) as raised:
        ci_workflow.generate(manifest)
    lines = str(raised.value).splitlines()
    shape = re.compile(re.escape(str(manifest.path)) + r": [\w.\[\]-]+: expected .+; got .+")
    for line in lines:
        assert shape.fullmatch(line), line
    return lines


def named(lines: list[str], key: str) -> str:
    """The one line naming `key`."""
    (line,) = [line for line in lines if line.split(": ", 2)[1] == key]
    return line


def test_the_manifests_own_workflow_and_stable_once_pinned_can_finish(tmp_path: Path) -> None:
    ci_workflow.generate(load_manifest(REAL))
    ci_workflow.generate(load(tmp_path, *STABLE))


# --- the runner and the index ---


def test_a_release_job_on_a_hosted_runner_is_refused(tmp_path: Path) -> None:
    lines = refusal(tmp_path, HOSTED)
    line = named(lines, "ci.release")
    assert "expected the self-hosted runner the release job runs on" in line
    assert "a hosted runner (ubuntu-24.04) loses when the job ends; got nothing" in line
    # The index of [ci.release] went with it: the manifest's own is the embedded one.
    assert 'got "embedded"' in named(lines, "publish.index")


def test_the_embedded_index_is_refused(tmp_path: Path) -> None:
    lines = refusal(
        tmp_path,
        ('index = "http://127.0.0.1:3141/activekv/release/+simple/"\n', ""),
        ('tuf_url = "http://127.0.0.1:8141/"\n', ""),
    )
    assert lines == [named(lines, "publish.index")]
    assert (
        "expected a remote index the release job publishes to, here or as ci.release.index"
        in (lines[0])
    )
    assert lines[0].endswith('gone when the job ends); got "embedded"')


def test_an_index_without_its_tuf_url_is_refused(tmp_path: Path) -> None:
    lines = refusal(tmp_path, ('tuf_url = "http://127.0.0.1:8141/"\n', ""))
    assert lines == [named(lines, "ci.release.tuf_url")]
    assert "expected the URL the TUF folder is served at" in lines[0]


def test_an_index_whose_upload_url_cannot_be_derived_is_refused(tmp_path: Path) -> None:
    lines = refusal(tmp_path, ("http://127.0.0.1:3141/activekv/release/+simple/",
                               "https://pypi.example.com/packages/"))  # fmt: skip
    assert lines == [named(lines, "ci.release.upload_url")]
    ci_workflow.generate(load(tmp_path, ("http://127.0.0.1:3141/activekv/release/+simple/",
                                         "https://pypi.example.com/packages/"),
                              ('tuf_url = "', 'upload_url = "https://pypi.example.com/up/"\n'
                                              'tuf_url = "')))  # fmt: skip


# --- keys ---


def test_a_local_file_key_on_a_hosted_runner_is_refused(tmp_path: Path) -> None:
    lines = refusal(tmp_path, *STABLE, HOSTED, TUF_FILE_KEYS)
    line = named(lines, "sign.stable.key")
    assert (
        "expected a signer URI (gcpkms:, awskms:, azurekms:, hv:, hsm:, ...): the hosted " in line
    )
    assert line.endswith('; got "file:/etc/activekv/stable-signing-key.pem"')
    for role in ("root", "targets", "snapshot", "timestamp"):
        assert named(lines, f"publish.tuf_keys.{role}.key").endswith(
            f'; got "file:/etc/activekv/tuf-{role}.pem"'
        )


def test_a_signer_uri_on_a_hosted_runner_is_not_refused_for_its_key(tmp_path: Path) -> None:
    """Negative control: a KMS key reaches its service from any runner."""
    uri = (
        'key = "file:/etc/activekv/stable-signing-key.pem"',
        'key = "awskms:arn:aws:kms:eu-west-1:1:key/1"\npublic_key = "keys/stable.pub.json"',
    )
    lines = refusal(tmp_path, *STABLE, HOSTED, TUF_FILE_KEYS, uri)  # fmt: skip
    assert not [line for line in lines if ": sign.stable.key: " in line]


def test_file_keys_on_a_self_hosted_release_runner_are_taken(tmp_path: Path) -> None:
    """keys = "manifest" on the self-hosted runner: the PEM files are the runner's."""
    ci_workflow.generate(load(tmp_path, *STABLE, KEYS_FROM_MANIFEST, TUF_FILE_KEYS))


def test_keys_from_the_manifest_without_tuf_keys_are_refused(tmp_path: Path) -> None:
    lines = refusal(tmp_path, *STABLE, KEYS_FROM_MANIFEST)
    assert lines == [named(lines, "publish.tuf_keys")]
    assert 'channel "stable" never takes generated ones' in lines[0]


def test_a_tag_channel_whose_keys_are_not_pinned_is_refused(tmp_path: Path) -> None:
    lines = refusal(tmp_path, STABLE[0])
    line = named(lines, "release.channels.stable.pinned")
    assert "expected the public keys that alone may sign channel 'stable'" in line
    assert "keygen --channel stable DIR --pin" in line


def test_a_manual_channel_whose_keys_are_not_pinned_is_refused_too(tmp_path: Path) -> None:
    lines = refusal(tmp_path, ('channels = ["dev"]', 'channels = ["dev", "stable"]'))
    named(lines, "release.channels.stable.pinned")


def test_a_pinned_key_file_that_is_no_public_key_is_refused(tmp_path: Path) -> None:
    missing = (STABLE[1][0], STABLE[1][1].replace('signing = ["' + "ab" * 32 + '"]',
                                                 'signing = ["keys/gone.pub.json"]'))  # fmt: skip
    lines = refusal(tmp_path, STABLE[0], missing)
    line = named(lines, "release.channels.stable.pinned.signing[0]")
    assert "expected a public key file beside the manifest" in line and "gone.pub.json" in line


# --- the GPU job's signer ---


def test_a_gpu_job_without_a_runner_signer_is_refused(tmp_path: Path) -> None:
    lines = refusal(tmp_path, *STABLE, (GPU_ATTESTER, 'gpu = ["signing-key"]'))
    line = named(lines, "release.channels.stable.attesters.gpu")
    assert "expected the public key file of the GPU runner's key, which signs the warmup, " in line
    assert line.endswith('; got ["signing-key"]')


def test_a_gpu_attester_that_is_no_public_key_is_refused(tmp_path: Path) -> None:
    lines = refusal(tmp_path, *STABLE, (GPU_ATTESTER, 'gpu = ["keys/gone.pub.json"]'))
    line = named(lines, "release.channels.stable.attesters.gpu[0]")
    assert "expected a public key file beside the manifest; got " in line


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    lines = refusal(tmp_path, STABLE[0], HOSTED, (GPU_ATTESTER, 'gpu = ["signing-key"]'))
    keys = [line.split(": ", 2)[1] for line in lines]
    assert keys == ["ci.release", "publish.index", "release.channels.stable.pinned",
                    "sign.stable.key", "publish.tuf_keys",
                    "release.channels.stable.attesters.gpu"]  # fmt: skip


# --- the command line ---


def test_ci_and_ci_check_refuse_and_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_variant(tmp_path, variant_text(STABLE[0]))
    # The checkout `ci` writes into is a copy: a refusal that regressed must not rewrite ours.
    committed = tmp_path / ".github" / "workflows" / "release.yml"
    committed.parent.mkdir(parents=True)
    shutil.copy2(ROOT / ".github" / "workflows" / "release.yml", committed)
    monkeypatch.setattr(cli, "REPO_ROOT", tmp_path)
    before = committed.read_bytes()
    assert cli.main(["ci", "--manifest", str(path)]) == 2
    assert cli.main(["ci", "--check", "--manifest", str(path)]) == 2
    assert committed.read_bytes() == before
    assert sorted(p.name for p in committed.parent.iterdir()) == ["release.yml"]
