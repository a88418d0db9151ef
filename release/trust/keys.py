"""Keys: an operator's key folder (`python -m release keygen` makes it, `--key-dir` reads it), and
which key signs what a run makes (the channel's provenance, the gates' attestations).

``keygen --channel stable DIR`` writes the stable channel's signing key and one key per TUF role
of the index (``root``, ``targets``, ``snapshot``, ``timestamp``); ``keygen --runner NAME DIR``
writes a runner's attestation key (a GPU runner signs its gate attestations with it; its public
key goes into the manifest's ``attesters``). Each key is an ed25519 PEM private key of mode 0600
and its public key (``*.pub.json``); the folder is made 0700, and an existing key is never
replaced.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from securesystemslib.signer import Key, Signer

from release.context import Context
from release.errors import SigningError
from release.manifest import ChannelSpec, SignSpec, TufKeys
from release.trust.sign import generated_key_pair, load_signer, signing_key_name
from release.util.progress import console

_RUNNER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


def tuf_key_name(role: str) -> str:
    return f"tuf-{role}"


def _pair(directory: Path, name: str) -> tuple[Path, Path]:
    return directory / f"{name}.pem", directory / f"{name}.pub.json"


def _make(directory: Path, names: list[str]) -> dict[str, Key]:
    existing = [path for name in names for path in _pair(directory, name) if path.exists()]
    if existing:
        raise SigningError(f"{directory}: already holds {', '.join(p.name for p in existing)}; "
                           "keys are never replaced (choose an empty folder)")  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    return {name: generated_key_pair(*_pair(directory, name))[1] for name in names}


def make_channel_keys(channel: str, directory: Path) -> dict[str, Key]:
    """The signing key of `channel` and the four TUF role keys, new, in `directory`."""
    if channel != "stable":
        raise SigningError(f"keygen --channel {channel}: expected stable (dev keys are generated "
                           "on first use under the state directory)")  # fmt: skip
    from release.trust.tuf_metadata import ROLES  # here: a GPU runner's keygen needs no tuf

    return _make(directory, [signing_key_name(channel), *(tuf_key_name(r) for r in ROLES)])


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


def channel_signer(context: Context, channel: str, spec: ChannelSpec) -> tuple[Signer, Key]:
    """The key that signs `channel`'s provenance: from --key-dir, else the manifest's
    `[sign.<spec.signing>]` (dev keys refused for stable, by fingerprint)."""
    if context.key_dir is not None:
        sign = channel_signing_spec(channel, context.key_dir)
    else:
        sign = context.manifest.sign[spec.signing]
    public_key = sign.public_key and context.manifest.path.parent / sign.public_key  # if relative
    return load_signer(
        sign.key, channel=channel, state_dir=context.state_dir, public_key=public_key
    )


def attesting_signer(context: Context) -> tuple[Signer, Key]:
    """The key that signs gate attestations here: the runner's (--attest-key), else the signing
    key of the run's channel (--channel, else the manifest's default channel)."""
    channel, spec = context.channel(context.channel_name)
    if context.attest_key is not None:
        return load_signer(
            f"file:{context.attest_key}", channel=channel, state_dir=context.state_dir
        )
    return channel_signer(context, channel, spec)


def step_keygen(channel: str | None, runner: str | None, directory: Path) -> int:
    """`keygen --channel stable DIR` or `keygen --runner NAME DIR` (release/trust/keys.py)."""
    if (channel is None) == (runner is None):
        raise SigningError("keygen: expected one of --channel stable or --runner NAME")
    if runner is not None:
        key = make_runner_key(runner, directory)
        console.print(f"runner key {key.keyid[:16]}: {directory / runner}.pem (private, 0600) "
                      f"and {directory / runner}.pub.json (list it in the manifest's "
                      "[release.channels.<name>.attesters])",
                      markup=False, soft_wrap=True)  # fmt: skip
        return 0
    assert channel is not None
    for name, key in make_channel_keys(channel, directory).items():
        console.print(f"{name}: key {key.keyid[:16]}: {directory / name}.pem (0600) and "
                      f"{name}.pub.json", markup=False, soft_wrap=True)  # fmt: skip
    console.print(f"publish with --channel {channel} --key-dir {directory}", markup=False,
                  soft_wrap=True)  # fmt: skip
    return 0
