"""`keygen --channel NAME DIR --pin`: the new keys' public halves written beside the manifest and
pinned in its ``[release.channels.<name>.pinned]`` table, one change the operator commits (and
without ``--pin``, that change printed). The manifest is edited with tomlkit, so its comments and
layout stay; the edit is checked by loading it before it replaces the file."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import tomlkit
from securesystemslib.signer import Key
from tomlkit.exceptions import TOMLKitError

from release.errors import ReleaseError, SigningError
from release.manifest import PinnedKeys, load_manifest
from release.trust.sign import write_public_key
from release.util.atomic import atomic_write

KEYS_FOLDER = "keys"  # beside the manifest, as the GPU attesters' public keys


def pin_paths(channel: str, keys: dict[str, Key]) -> dict[str, str]:
    """Per use (``signing`` or a TUF role), the path relative to the manifest its key is pinned
    by: the keyid in the name, so a rotated key never takes an old one's file."""
    paths = {}
    for use, key in keys.items():
        name = "signing-key" if use == "signing" else f"tuf-{use}"
        paths[use] = str(PurePosixPath(KEYS_FOLDER, f"{channel}-{name}-{key.keyid[:12]}.pub.json"))
    return paths


def pinned_table(channel: str, paths: dict[str, str]) -> str:
    """The TOML the operator adds to the manifest (what ``--pin`` writes)."""
    lines = [f"[release.channels.{channel}.pinned]"]
    lines += [f'{use} = ["{paths[use]}"]' for use in PinnedKeys.model_fields]
    return "\n".join(lines)


def pin(manifest_path: Path, channel: str, keys: dict[str, Key]) -> dict[str, str]:
    """Writes each key's public file beside ``manifest_path`` and pins exactly these keys for
    ``channel`` (replacing its earlier pins: a rotation). Nothing is left changed on failure."""
    paths = pin_paths(channel, keys)
    text = _pinned_text(manifest_path, channel, paths)
    written: list[Path] = []
    try:
        for use, relative in paths.items():
            target = manifest_path.parent / relative
            if target.exists():
                raise SigningError(f"{target}: already exists; a pinned key file is never replaced")
            target.parent.mkdir(parents=True, exist_ok=True)
            write_public_key(keys[use], target)
            written.append(target)
        _check_loads(manifest_path, text)
        atomic_write(manifest_path, text.encode("utf-8"))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return paths


def _pinned_text(manifest_path: Path, channel: str, paths: dict[str, str]) -> str:
    try:
        document = tomlkit.parse(manifest_path.read_text(encoding="utf-8"))
        table = document["release"]["channels"][channel]  # type: ignore[index]
    except (OSError, TOMLKitError, KeyError, TypeError) as error:
        raise SigningError(
            f"{manifest_path}: release.channels.{channel}: expected the channel's table to pin "
            f"its keys in; {type(error).__name__}: {error}"
        ) from None
    pinned = tomlkit.table()
    pinned.add(tomlkit.comment("The only keys that sign this channel (keygen --pin); a rotation "
                               "is a commit of this table (docs/trust.md)."))  # fmt: skip
    for use in PinnedKeys.model_fields:
        pinned[use] = [paths[use]]
    pinned.add(tomlkit.nl())
    if "pinned" in table:
        del table["pinned"]
    table["pinned"] = pinned
    return tomlkit.dumps(document)


def _check_loads(manifest_path: Path, text: str) -> None:
    """The edited manifest, loaded from a copy beside it (its relative paths resolve the same)."""
    trial = manifest_path.with_name(f".{manifest_path.name}.{os.getpid()}.pin.toml")
    try:
        trial.write_text(text, encoding="utf-8")
        load_manifest(trial)
    except ReleaseError as error:
        said = str(error).replace(str(trial), manifest_path.name)
        raise SigningError(
            f"{manifest_path}: pinning the keys would make it invalid: {said}"
        ) from None
    finally:
        trial.unlink(missing_ok=True)
