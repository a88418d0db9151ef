"""Keys: an operator's key folder (`python -m release keygen` makes it, `--key-dir` reads it), and
which key signs what a run makes (the channel's provenance, the gates' attestations).

``keygen --channel stable DIR`` writes the stable channel's signing key and one key per TUF role
of the index (``root``, ``targets``, ``snapshot``, ``timestamp``); ``keygen --runner NAME DIR``
writes a runner's attestation key (a GPU runner signs its gate attestations with it; its public
key goes into the manifest's ``attesters``). Each key is an ed25519 PEM private key of mode 0600
and its public key (``*.pub.json``). A new folder is made 0700; an existing one is taken only when
it is already private (its mode is never changed), and an existing key is never replaced.
``--pin`` also pins the new channel keys in the manifest (release/trust/pin_manifest.py).

A channel that signs with an operator's key takes only the keys its manifest pins
(release/trust/pins.py), whatever folder they are loaded from.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from securesystemslib.signer import Key, Signer

from release.errors import SigningError
from release.manifest import ChannelSpec, Manifest, SignSpec, TufKeys
from release.trust.pins import SIGNING, channel_pins
from release.trust.sign import generated_key_pair, load_signer, signing_key_name
from release.util.progress import console

_RUNNER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


class KeySources(Protocol):
    """What choosing a run's keys reads of it (``release.context.Context`` is one): the keys
    come from these places only, so trust needs no step context."""

    @property
    def manifest(self) -> Manifest: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def key_dir(self) -> Path | None: ...  # --key-dir
    @property
    def attest_key(self) -> Path | None: ...  # --attest-key
    @property
    def channel_name(self) -> str | None: ...  # --channel

    def channel(self, name: str | None) -> tuple[str, ChannelSpec]: ...


def tuf_key_name(role: str) -> str:
    return f"tuf-{role}"


def _pair(directory: Path, name: str) -> tuple[Path, Path]:
    return directory / f"{name}.pem", directory / f"{name}.pub.json"


def _private_folder(directory: Path) -> None:
    """``directory`` made 0700, or, when it exists, checked to be a private folder of this user:
    an existing folder's mode is never changed (a shared 1777 folder stays shared)."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise SigningError(
            f"keygen {directory}: cannot make the folder ({error.strerror})"
        ) from None
    else:
        os.chmod(directory, 0o700)  # ours, just made: whatever the umask
        return
    info = directory.lstat()
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode):
        raise SigningError(f"keygen {directory}: expected a folder for the keys; it is not one")
    if mode & 0o077 or info.st_uid != os.getuid():
        raise SigningError(f"keygen {directory}: expected a folder only you may use (mode 0700, "
                           f"yours), or a path that does not exist yet; it has mode {mode:04o} "
                           f"(uid {info.st_uid}). Its mode is left as it is: give a new folder "
                           f"inside it, e.g. {directory / 'activekv-keys'}")  # fmt: skip


def _make(directory: Path, names: list[str]) -> dict[str, Key]:
    existing = [path for name in names for path in _pair(directory, name) if path.exists()]
    if existing:
        raise SigningError(f"{directory}: already holds {', '.join(p.name for p in existing)}; "
                           "keys are never replaced (choose an empty folder)")  # fmt: skip
    _private_folder(directory)
    return {name: generated_key_pair(*_pair(directory, name))[1] for name in names}


def channel_key_names(channel: str) -> dict[str, str]:
    """Per use (``signing`` or a TUF role), the file name (no suffix) of a channel's key."""
    from release.trust.tuf_metadata import ROLES  # here: a GPU runner's keygen needs no tuf

    return {SIGNING: signing_key_name(channel), **{role: tuf_key_name(role) for role in ROLES}}


def make_channel_keys(channel: str, directory: Path) -> dict[str, Key]:
    """The signing key of `channel` and the four TUF role keys, new, in `directory`, by use."""
    if channel != "stable":
        raise SigningError(f"keygen --channel {channel}: expected stable (dev keys are generated "
                           "on first use under the state directory)")  # fmt: skip
    names = channel_key_names(channel)
    made = _make(directory, list(names.values()))
    return {use: made[name] for use, name in names.items()}


def make_runner_key(name: str, directory: Path) -> Key:
    """A runner's attestation key, new, in `directory` as `<name>.pem` and `<name>.pub.json`."""
    if not _RUNNER_NAME.fullmatch(name):
        raise SigningError(f"keygen --runner: expected a name of lowercase letters, digits, '.', "
                           f"'_' and '-'; got {name!r}")  # fmt: skip
    return _make(directory, [name])[name]


def _file_ref(directory: Path, name: str) -> str:
    pem = _pair(directory, name)[0]
    if not pem.is_file():
        made_by = f"python -m release keygen --channel stable {directory}"
        raise SigningError(f"--key-dir {directory}: expected {pem.name} ({made_by}); missing")
    return f"file:{pem.resolve()}"


def channel_signing_spec(channel: str, directory: Path) -> SignSpec:
    """`[sign.<channel>]` as the key folder gives it."""
    return SignSpec(key=_file_ref(directory, signing_key_name(channel)))


def tuf_keys_spec(directory: Path) -> TufKeys:
    """`[publish.tuf_keys]` as the key folder gives it."""
    from release.trust.tuf_metadata import ROLES

    roles = {role: SignSpec(key=_file_ref(directory, tuf_key_name(role))) for role in ROLES}
    return TufKeys(**roles)


def channel_signer(context: KeySources, channel: str, spec: ChannelSpec) -> tuple[Signer, Key]:
    """The key that signs `channel`'s provenance: from --key-dir, else the manifest's
    `[sign.<spec.signing>]`; taken only when the channel pins it (release/trust/pins.py)."""
    pins = channel_pins(context.manifest, channel, spec)
    if context.key_dir is not None:
        sign, source = (
            channel_signing_spec(channel, context.key_dir),
            f"--key-dir {context.key_dir}",
        )
    else:
        sign, source = context.manifest.sign[spec.signing], f"[sign.{spec.signing}]"
    public_key = sign.public_key and context.manifest.path.parent / sign.public_key  # if relative
    signer, key = load_signer(
        sign.key, channel=channel, state_dir=context.state_dir, public_key=public_key
    )
    pins.require(key, SIGNING, f"{source} ({sign.key})")
    return signer, key


SignerAndKey = tuple[Signer, Key]


@dataclass(frozen=True)
class RunKeys:
    """The keys a run signs with, loaded once before it builds: the gates' attestations' and
    the channel's provenance's (one key where the channel's signs both)."""

    attesting: SignerAndKey
    signing: SignerAndKey


def run_keys(context: KeySources, channel: str, spec: ChannelSpec) -> RunKeys:
    """The keys of a run of `channel` (see attesting_signer and channel_signer), each loaded
    once."""
    signing = channel_signer(context, channel, spec)
    own = context.channel_name or context.manifest.release.default_channel
    if context.attest_key is None and own == channel:
        return RunKeys(signing, signing)  # the channel's key signs the attestations too
    return RunKeys(attesting_signer(context), signing)


def attesting_signer(context: KeySources) -> tuple[Signer, Key]:
    """The key that signs gate attestations here: the runner's (--attest-key), else the signing
    key of the run's channel (--channel, else the manifest's default channel)."""
    channel, spec = context.channel(context.channel_name)
    if context.attest_key is not None:
        return load_signer(
            f"file:{context.attest_key}", channel=channel, state_dir=context.state_dir
        )
    return channel_signer(context, channel, spec)


def step_keygen(
    channel: str | None, runner: str | None, directory: Path, *, pin: bool, manifest_path: Path
) -> int:
    """`keygen --channel stable DIR [--pin]` or `keygen --runner NAME DIR`
    (release/trust/keys.py)."""
    if (channel is None) == (runner is None):
        raise SigningError("keygen: expected one of --channel stable or --runner NAME")
    if runner is not None:
        if pin:
            raise SigningError("keygen --runner: --pin pins a channel's keys; list a runner's "
                               "public key under the channel's attesters.gpu")  # fmt: skip
        key = make_runner_key(runner, directory)
        console.print(f"runner key {key.keyid[:16]}: {directory / runner}.pem (private, 0600) "
                      f"and {directory / runner}.pub.json (list it in the manifest's "
                      "[release.channels.<name>.attesters])",
                      markup=False, soft_wrap=True)  # fmt: skip
        return 0
    assert channel is not None
    from release.trust.pin_manifest import pin as pin_keys
    from release.trust.pin_manifest import pin_paths, pinned_table

    keys, names = make_channel_keys(channel, directory), channel_key_names(channel)
    for use, key in keys.items():
        console.print(f"{names[use]}: key {key.keyid[:16]}: {directory / names[use]}.pem (0600) "
                      f"and {names[use]}.pub.json", markup=False, soft_wrap=True)  # fmt: skip
    if pin:
        try:
            paths = pin_keys(manifest_path, channel, keys)
        except BaseException:  # keys that could not be pinned are not left to be used
            for name in names.values():
                for path in _pair(directory, name):
                    path.unlink(missing_ok=True)
            raise
        console.print(f"pinned in {manifest_path} [release.channels.{channel}.pinned], public "
                      f"keys beside it ({', '.join(paths.values())}): commit that change",
                      markup=False, soft_wrap=True)  # fmt: skip
    else:
        paths = pin_paths(channel, keys)
        copies = "\n".join(f"  cp {directory / names[use]}.pub.json "
                           f"{manifest_path.parent / paths[use]}" for use in paths)  # fmt: skip
        console.print(f"not pinned: channel {channel!r} refuses these keys until its manifest "
                      f"pins them (or run keygen with --pin). Commit these files:\n{copies}\n"
                      f"and this table in {manifest_path}:\n{pinned_table(channel, paths)}",
                      markup=False, soft_wrap=True)  # fmt: skip
    console.print(f"publish with --channel {channel} --key-dir {directory}", markup=False,
                  soft_wrap=True)  # fmt: skip
    return 0
