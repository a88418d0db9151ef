"""What the manifest must hold for every path of its workflow to finish a release.

`python -m release ci` (and `ci --check`) writes nothing for a manifest that fails here: each
problem is one line, ``<manifest>: <key>: expected …; got …``, naming the key to change.

* **The release runner** is self-hosted (``[ci.release]``): the release job writes the index's
  TUF repository into the folder the operator's web server serves, and keeps the pipeline's
  state (generated dev keys, which the index's root names) between runs; a hosted runner loses
  both when the job ends (docs/ci.md).
* **The index** is a remote one (``ci.release.index``, else ``publish.index``): the embedded
  index is a pypiserver inside the job, gone when it ends.
* **Keys** of a channel signed by an operator's key: pinned in the manifest
  (``[release.channels.<name>.pinned]``, each pinned file a public key); from the repository's
  secrets (``keys = "secrets"``), or from the manifest's references (``keys = "manifest"``):
  then ``[publish.tuf_keys]`` is given and no ``file:`` key is left to a hosted runner.
* **The GPU job** signs with the runner's own key: a channel that requires a GPU gate lists that
  key's public key file under ``attesters.gpu``, and the file is a public key.

Secrets and the runner's folders cannot be seen from here: the steps that read them fail naming
the one that is missing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from release import catalogue
from release.errors import ManifestError, SigningError
from release.manifest import SIGNING_KEY_ATTESTER, CiRelease, CiSettings, Manifest, index_root
from release.trust.pins import channel_pins, operator_signed
from release.trust.sign import is_file_key, load_public_key
from release.trust.tuf_metadata import ROLES


@dataclass(frozen=True)
class ReleaseTarget:
    """Where the release job publishes: the index, its TUF URL, and the publish options that
    replace the manifest's ``[publish]`` keys for the job (``--tuf-dir`` is the runner's)."""

    index: str
    tuf_url: str
    options: dict[str, str]


def release_target(manifest: Manifest, release: CiRelease) -> ReleaseTarget:
    """The release job's index: ``[ci.release]``'s keys over ``[publish]``'s (refusals() has
    checked that the result is a remote index with its TUF URL)."""
    given = {key: getattr(release, key) for key in ("index", "upload_url", "tuf_url")}
    options = {key: value for key, value in given.items() if value is not None}
    publish = manifest.publish
    tuf_url = release.tuf_url or ("" if release.index else publish.tuf_url or "")
    return ReleaseTarget(release.index or publish.index, tuf_url, options)


def gpu_gates(manifest: Manifest, channel: str) -> list[str]:
    """The gates ``channel`` requires that run on a GPU runner."""
    known = catalogue.names()
    return [g for g in manifest.channel(channel).requires
            if g in known and catalogue.runner_of(g) == "gpu"]  # fmt: skip


def check(manifest: Manifest, ci: CiSettings) -> None:
    """ManifestError, one line per problem, unless every path of the workflow can finish."""
    lines = refusals(manifest, ci)
    if lines:
        raise ManifestError("\n".join(dict.fromkeys(lines)))  # a shared key is named once


def refusals(manifest: Manifest, ci: CiSettings) -> list[str]:
    """Each reason a path of the workflow `ci` describes could not finish, as one line."""
    lines = _runner(manifest, ci) + _index(manifest, ci.release)
    for channel in ci.channels:
        lines += _keys(manifest, ci, channel) + _gpu_signer(manifest, channel)
    return lines


def _line(manifest: Manifest, key: str, expected: str, got: str) -> str:
    return f"{manifest.path}: {key}: expected {expected}; got {got}"


def _show(value: object) -> str:
    return json.dumps(value)


def _runner(manifest: Manifest, ci: CiSettings) -> list[str]:
    if ci.release is not None:
        return []
    expected = (
        "the self-hosted runner the release job runs on (runner_labels): it writes the index's "
        "TUF repository to the folder the operator's web server serves and keeps the pipeline's "
        f"state, which a hosted runner ({ci.build_runner}) loses when the job ends"
    )
    return [_line(manifest, "ci.release", expected, "nothing")]


def _index(manifest: Manifest, release: CiRelease | None) -> list[str]:
    if release is not None and release.index is not None:
        lines = []
        if release.tuf_url is None:
            expected = ("the URL the TUF folder is served at (ci.release.index replaces "
                        "publish.index, and with it publish.tuf_url)")  # fmt: skip
            lines.append(_line(manifest, "ci.release.tuf_url", expected, "nothing"))
        if release.upload_url is None and index_root(release.index) is None:
            expected = ("the URL twine uploads to (ci.release.index does not end in /simple/ or "
                        "/+simple/, so it cannot be derived)")  # fmt: skip
            lines.append(_line(manifest, "ci.release.upload_url", expected, "nothing"))
        return lines
    if manifest.publish.embedded:
        expected = (
            "a remote index the release job publishes to, here or as ci.release.index (the "
            "embedded index is a pypiserver inside the job, gone when the job ends)"
        )
        return [_line(manifest, "publish.index", expected, _show(manifest.publish.index))]
    return []


def _keys(manifest: Manifest, ci: CiSettings, channel: str) -> list[str]:
    spec = manifest.channel(channel)
    if not operator_signed(manifest, spec):
        return []  # generated keys, kept in the release runner's state folder
    lines = _pins(manifest, channel)
    mode = ci.release.keys if ci.release is not None else "manifest"
    if mode == "secrets":
        return lines  # the key step fails naming a secret that is not set
    hosted = ci.release is None
    sign = manifest.sign.get(spec.signing)
    if hosted and sign is not None and is_file_key(sign.key):
        lines.append(_line(manifest, f"sign.{spec.signing}.key", _NO_FILE_KEY, _show(sign.key)))
    tuf_keys = manifest.publish.tuf_keys
    if tuf_keys is None:
        expected = (
            f'a key reference for each TUF role: channel "{channel}" never takes generated '
            'ones (or keys = "secrets" in [ci.release])'
        )
        lines.append(_line(manifest, "publish.tuf_keys", expected, "nothing"))
    elif hosted:
        for role in ROLES:
            key = getattr(tuf_keys, role).key
            if is_file_key(key):
                where = f"publish.tuf_keys.{role}.key"
                lines.append(_line(manifest, where, _NO_FILE_KEY, _show(key)))
    return lines


def _pins(manifest: Manifest, channel: str) -> list[str]:
    """The channel's pinned table, each pinned file a public key beside the manifest."""
    pinned = manifest.channel(channel).pinned
    if pinned is None:
        try:
            channel_pins(manifest, channel, manifest.channel(channel))
        except SigningError as error:  # pins.py's own line: the key, and how to pin one
            return [str(error)]
        return []
    lines = []
    for use, entries in pinned.model_dump().items():
        for index, entry in enumerate(entries):
            if not re.fullmatch(r"[0-9a-f]{64}", entry):  # a keyid is taken as it is
                lines += _public_key(manifest, f"release.channels.{channel}.pinned.{use}[{index}]",
                                     entry)  # fmt: skip
    return lines


def _public_key(manifest: Manifest, key: str, entry: str) -> list[str]:
    try:
        load_public_key(manifest.path.parent / entry)
    except SigningError as error:
        return [_line(manifest, key, "a public key file beside the manifest", str(error))]
    return []


_NO_FILE_KEY = (
    "a signer URI (gcpkms:, awskms:, azurekms:, hv:, hsm:, ...): the hosted runner has no local "
    'key file (or keys = "secrets" in [ci.release], or a self-hosted release runner that holds '
    "the file)"
)


def _gpu_signer(manifest: Manifest, channel: str) -> list[str]:
    """A channel that requires GPU gates takes the GPU job's attestations only by a runner key
    it lists: the channel's signing key never reaches the GPU runner."""
    gates = gpu_gates(manifest, channel)
    if not gates:
        return []
    key = f"release.channels.{channel}.attesters.gpu"
    listed = manifest.channel(channel).attesters.get("gpu", ())
    runners = [(i, entry) for i, entry in enumerate(listed) if entry != SIGNING_KEY_ATTESTER]
    if not runners:
        expected = (
            f"the public key file of the GPU runner's key, which signs the {', '.join(gates)} "
            "attestations in the GPU job (`python -m release keygen --runner NAME DIR` on the "
            "runner; the channel's signing key never reaches it)"
        )
        return [_line(manifest, key, expected, _show(list(listed)))]
    return [line for i, entry in runners for line in _public_key(manifest, f"{key}[{i}]", entry)]
