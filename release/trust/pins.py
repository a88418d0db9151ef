"""Pinned keys: a channel signed by an operator's key takes a signature, a gate attestation or
TUF metadata only by a key its manifest entry pins (``[release.channels.<name>.pinned]``),
whatever file or folder holds the key. An allowlist: a key is never judged by where it came from.

A pin is a public key file beside the manifest (``*.pub.json``) or a keyid. A channel whose
``[sign.*]`` key is ``generate`` (dev) may go unpinned: its keys are made per state directory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from securesystemslib.signer import Key

from release.errors import SigningError
from release.manifest import ChannelSpec, Manifest
from release.trust.sign import load_public_key

SIGNING = "signing"  # the channel's provenance key (and its CPU gate attestations)
_KEYID = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ChannelPins:
    """The keyids a channel's manifest entry pins, per use (``signing`` or a TUF role); None
    where the channel is unpinned and need not be."""

    manifest: Manifest
    channel: str
    by_use: dict[str, frozenset[str]] | None

    def where(self, use: str) -> str:
        return f"{self.manifest.path}: release.channels.{self.channel}.pinned.{use}"

    def require(self, key: Key, use: str, what: str) -> None:
        """SigningError unless ``key`` is pinned for ``use`` (nothing to check when unpinned)."""
        if self.by_use is None:
            return
        pinned = self.by_use[use]
        if key.keyid not in pinned:
            raise SigningError(
                f"{self.where(use)}: expected a pinned key ({_shown(pinned)}); got key "
                f"{key.keyid} of {what}: channel {self.channel!r} takes only a pinned key, "
                "whatever folder holds it (pin a new key with a manifest commit: docs/trust.md)"
            )

    def require_all(self, keyids: Iterable[str], use: str, what: str) -> None:
        """SigningError unless every one of ``keyids`` (those a TUF root names) is pinned."""
        if self.by_use is None:
            return
        unpinned = sorted(set(keyids) - self.by_use[use])
        if unpinned:
            raise SigningError(
                f"{self.where(use)}: expected {what} to name only pinned keys "
                f"({_shown(self.by_use[use])}); it names {', '.join(unpinned)}"
            )


def _shown(keyids: Iterable[str]) -> str:
    return ", ".join(keyid[:16] for keyid in sorted(keyids))


def operator_signed(manifest: Manifest, spec: ChannelSpec) -> bool:
    """Whether the channel signs with an operator's key, which it must pin."""
    sign = manifest.sign.get(spec.signing)
    return sign is None or not sign.generated


def channel_pins(manifest: Manifest, channel: str, spec: ChannelSpec) -> ChannelPins:
    """The channel's pins, each pinned file read (SigningError naming the key of one that is not
    a public key), or SigningError when a channel that must pin has none."""
    pinned = spec.pinned
    if pinned is None:
        if operator_signed(manifest, spec):
            raise SigningError(
                f"{manifest.path}: release.channels.{channel}.pinned: expected the public keys "
                f"that alone may sign channel {channel!r} (its signing key and each TUF role's); "
                "got none. A key is refused until it is pinned: `python -m release keygen "
                f"--channel {channel} DIR --pin` writes and pins new ones"
            )
        return ChannelPins(manifest, channel, None)
    by_use: dict[str, frozenset[str]] = {}
    for use, entries in pinned.model_dump().items():
        keyids = set()
        for index, entry in enumerate(entries):
            if _KEYID.fullmatch(entry):
                keyids.add(entry)
                continue
            try:
                keyids.add(load_public_key(manifest.path.parent / entry).keyid)
            except SigningError as error:
                raise SigningError(
                    f"{manifest.path}: release.channels.{channel}.pinned.{use}[{index}]: expected "
                    f"a public key file beside the manifest; {error}"
                ) from None
        by_use[use] = frozenset(keyids)
    return ChannelPins(manifest, channel, by_use)
