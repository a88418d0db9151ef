"""Pinned keys (release/trust/pins.py, keygen --pin): stable takes a signature, an attestation or
TUF metadata only by a key its manifest pins, whatever file, folder or state directory holds the
key; keygen never changes an existing folder's mode."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from release.cli import main
from release.context import Context
from release.errors import ManifestError, SigningError
from release.manifest import load_manifest
from release.trust.keys import channel_signer, make_channel_keys, tuf_keys_spec
from release.trust.pins import channel_pins
from release.trust.sign import key_paths, load_public_key, load_signer
from release.trust.steps import _require_pinned_root, _require_pinned_tuf_keys
from release.trust.tuf_metadata import TufRepository, repository_for
from release.util.paths import DEFAULT_MANIFEST, REPO_ROOT
from tests.ci_manifests import unpinned


def _manifest_copy(tmp_path: Path) -> Path:
    """The default manifest and its key folder, copied, stable not pinned yet (as before its
    operator's first `keygen --pin`): keygen --pin edits the copy."""
    folder = tmp_path / "manifests"
    shutil.copytree(DEFAULT_MANIFEST.parent, folder)
    copy = folder / DEFAULT_MANIFEST.name
    copy.write_text(unpinned(DEFAULT_MANIFEST.read_text()))
    return copy


def _pinned(tmp_path: Path) -> tuple[Path, Path]:
    manifest, keys = _manifest_copy(tmp_path), tmp_path / "keys"
    assert main(["keygen", "--manifest", str(manifest), "--channel", "stable", str(keys),
                 "--pin"]) == 0  # fmt: skip
    return manifest, keys


def _context(manifest: Path, tmp_path: Path, state: str = "state", **given) -> Context:
    return Context(load_manifest(manifest), REPO_ROOT, tmp_path / "out", tmp_path / state, **given)


def _stable(context: Context):
    return channel_signer(context, "stable", context.manifest.channel("stable"))


def test_keygen_pin_writes_the_public_keys_beside_the_manifest_and_pins_them(tmp_path, capsys):
    manifest, keys = _pinned(tmp_path)
    loaded = load_manifest(manifest)
    pinned = loaded.channel("stable").pinned
    assert pinned is not None
    for use, file_name in (("signing", "stable-signing-key"), ("root", "tuf-root"),
                           ("timestamp", "tuf-timestamp")):  # fmt: skip
        (entry,) = getattr(pinned, use)
        made = load_public_key(keys / f"{file_name}.pub.json")
        assert load_public_key(manifest.parent / entry) == made
        assert made.keyid[:12] in entry
    text = manifest.read_text()
    assert text.startswith(
        unpinned(DEFAULT_MANIFEST.read_text()).split("[release.channels.stable]")[0]
    )
    assert "# Whose signed gate attestations count" in text  # comments stay
    assert "commit that change" in capsys.readouterr().out


def test_keygen_without_pin_prints_what_to_commit_and_changes_nothing(tmp_path, capsys):
    manifest = _manifest_copy(tmp_path)
    before = manifest.read_bytes()
    assert main(["keygen", "--manifest", str(manifest), "--channel", "stable",
                 str(tmp_path / "keys")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "not pinned" in out and "[release.channels.stable.pinned]" in out
    assert 'signing = ["keys/stable-signing-key-' in out
    assert manifest.read_bytes() == before
    assert sorted(p.name for p in (manifest.parent / "keys").iterdir()) == sorted(
        p.name for p in (DEFAULT_MANIFEST.parent / "keys").iterdir()
    )


def test_a_pin_that_cannot_be_written_leaves_no_key_and_no_edit(tmp_path, capsys, monkeypatch):
    manifest = _manifest_copy(tmp_path)
    before = manifest.read_bytes()
    listed = sorted((manifest.parent / "keys").iterdir())

    def disk_full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr("release.trust.pin_manifest.atomic_write", disk_full)
    keys = tmp_path / "keys"
    assert main(["keygen", "--manifest", str(manifest), "--channel", "stable", str(keys),
                 "--pin"]) == 2  # fmt: skip
    assert f"{manifest}: No space left on device" in capsys.readouterr().err
    assert not [p for p in keys.iterdir() if p.is_file()]
    assert manifest.read_bytes() == before
    assert sorted((manifest.parent / "keys").iterdir()) == listed


def test_the_pinned_key_signs_stable_and_no_other_key_does_from_any_folder(tmp_path):
    manifest, keys = _pinned(tmp_path)
    _, public = _stable(_context(manifest, tmp_path, key_dir=keys))
    assert public == load_public_key(keys / "stable-signing-key.pub.json")
    # A dev key copied into a key folder, with the state directory pointing elsewhere: the
    # fingerprint scan of one state directory never saw it; the allowlist refuses it.
    load_signer("generate", channel="dev", state_dir=tmp_path / "dev-state")
    copied = tmp_path / "copied"
    make_channel_keys("stable", copied)
    shutil.copyfile(key_paths(tmp_path / "dev-state", "dev")[0], copied / "stable-signing-key.pem")
    for state in ("state", "elsewhere"):
        refused = (
            r"stable\.pinned\.signing: expected a pinned key \(.*\); got key \w{64} of --key-dir"
        )
        with pytest.raises(SigningError, match=refused):
            _stable(_context(manifest, tmp_path, state, key_dir=copied))


def test_a_key_keygen_just_made_is_refused_until_it_is_pinned(tmp_path):
    manifest, _ = _pinned(tmp_path)
    fresh = tmp_path / "fresh"
    assert main(["keygen", "--manifest", str(manifest), "--channel", "stable", str(fresh)]) == 0
    with pytest.raises(SigningError, match=r"pinned\.signing: expected a pinned key"):
        _stable(_context(manifest, tmp_path, key_dir=fresh))
    # A manifest that pins nothing for stable: every key is refused, saying how to pin.
    unpinned_copy = _manifest_copy(tmp_path / "unpinned")
    with pytest.raises(SigningError, match=r"release\.channels\.stable\.pinned: expected the "
                       r"public keys .* got none.*keygen --channel stable DIR --pin"):  # fmt: skip
        _stable(_context(unpinned_copy, tmp_path, key_dir=fresh))


def test_a_pin_that_is_not_a_public_key_is_named(tmp_path):
    manifest, keys = _pinned(tmp_path)
    pinned = load_manifest(manifest).channel("stable").pinned
    assert pinned is not None
    (manifest.parent / pinned.root[0]).write_text("{}")
    with pytest.raises(SigningError, match=r"pinned\.root\[0\]: expected a public key file"):
        _stable(_context(manifest, tmp_path, key_dir=keys))


@pytest.mark.parametrize("entry", ['"/etc/k.pub.json"', '"../k.pub.json"', '"k.pem"', '"ABC"', ""])
def test_a_malformed_pin_is_refused_naming_the_key(tmp_path, entry):
    manifest, _ = _pinned(tmp_path)
    text = manifest.read_text()
    start = text.index("root = [") + len("root = [")
    manifest.write_text(text[:start] + entry + text[text.index("]", start) :])
    expected = "a non-empty array" if not entry else "a public key file"
    with pytest.raises(ManifestError, match=rf"release\.channels\.stable\.pinned\.root.*"
                       rf"expected {expected}"):  # fmt: skip
        load_manifest(manifest)


def test_a_pin_by_keyid_counts_as_the_key(tmp_path):
    manifest, keys = _pinned(tmp_path)
    keyid = load_public_key(keys / "stable-signing-key.pub.json").keyid
    text = manifest.read_text()
    start = text.index("signing = [") + len("signing = [")
    manifest.write_text(text[:start] + f'"{keyid}"' + text[text.index("]", start) :])
    _, public = _stable(_context(manifest, tmp_path, key_dir=keys))
    assert public.keyid == keyid


def _tuf(tmp_path: Path, keys: Path | None, keys_dir: Path | None = None) -> TufRepository:
    tuf_keys = tuf_keys_spec(keys) if keys is not None else None
    return repository_for(tmp_path / "tuf", tuf_keys, channel="dev", state_dir=tmp_path / "state",
                          manifest_dir=tmp_path, keys_dir=keys_dir)  # fmt: skip


def test_stable_tuf_metadata_is_signed_only_by_pinned_role_keys(tmp_path):
    manifest, keys = _pinned(tmp_path)
    pins = channel_pins(
        load_manifest(manifest), "stable", load_manifest(manifest).channel("stable")
    )
    _require_pinned_tuf_keys(pins, _tuf(tmp_path, keys), "--key-dir")
    # Role keys of another folder (a fresh keygen), or those generated for a remote index under
    # <state>/remote-index/tuf-keys/: none of them is pinned, whichever role.
    other = tmp_path / "other"
    make_channel_keys("stable", other)
    with pytest.raises(SigningError, match=r"pinned\.root: expected a pinned key"):
        _require_pinned_tuf_keys(pins, _tuf(tmp_path, other), "--key-dir")
    generated = tmp_path / "state" / "remote-index" / "tuf-keys"
    repository = _tuf(tmp_path / "remote", None, keys_dir=generated)
    repository.add_targets({})  # generates its keys and a root signed by them
    with pytest.raises(SigningError, match=r"pinned\.root: expected a pinned key .* the "
                       r"generated key .*remote-index/tuf-keys/root\.pub\.json"):  # fmt: skip
        _require_pinned_tuf_keys(pins, repository, "[publish.tuf_keys]")
    # The root that repository wrote names unpinned keys: a verify of stable refuses it.
    with pytest.raises(SigningError, match=r"pinned\.root: expected the TUF root .* to name only "
                       r"pinned keys"):  # fmt: skip
        _require_pinned_root(pins, repository.trusted_root_path)


def test_a_root_with_other_keys_refuses_pinned_signers_too(tmp_path):
    """Pinned signers over a repository whose root another set of keys made: refused before
    anything is written (the root's keys are judged, not only the signers)."""
    manifest, _ = _pinned(tmp_path)
    pins = channel_pins(
        load_manifest(manifest), "stable", load_manifest(manifest).channel("stable")
    )
    made_by_others = _tuf(tmp_path, None, keys_dir=tmp_path / "generated")
    made_by_others.add_targets({})
    with pytest.raises(SigningError, match=r"to name only pinned keys"):
        _require_pinned_root(pins, made_by_others.trusted_root_path)


# --- keygen's folder ---


def test_keygen_never_changes_the_mode_of_an_existing_folder(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert main(["keygen", "--runner", "h200", str(shared)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"keygen {shared}: expected a folder only you may use (mode 0700, yours)" in err
    assert "it has mode 1777" in err and str(shared / "activekv-keys") in err
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert not list(shared.iterdir())
    # A new folder inside it is made private; an existing private one is taken as it is.
    assert main(["keygen", "--runner", "h200", str(shared / "activekv-keys")]) == 0
    assert stat.S_IMODE((shared / "activekv-keys").stat().st_mode) == 0o700
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    assert main(["keygen", "--channel", "stable", str(private)]) == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    group_readable = tmp_path / "group"
    group_readable.mkdir()
    group_readable.chmod(0o750)
    assert main(["keygen", "--runner", "r", str(group_readable)]) == 2
    assert stat.S_IMODE(group_readable.stat().st_mode) == 0o750


def test_keygen_refuses_a_file_and_pin_with_a_runner(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["keygen", "--runner", "r", str(tmp_path / "file")]) == 2
    assert "expected a folder for the keys" in capsys.readouterr().err
    assert main(["keygen", "--runner", "r", "--pin", str(tmp_path / "k")]) == 2
    assert "--pin pins a channel's keys" in capsys.readouterr().err
    assert not (tmp_path / "k").exists()
