"""The reuse store: a verdict, a signature or a verify found before, kept under the state
directory by a key over everything it depends on (docs/reuse.md).

An entry is ``<state_dir>/reuse/<kind>/<name>/<key>.json``: the key (sha256 of the canonical JSON
of the inputs, sorted keys), the inputs themselves (to say what changed when a key misses), when
it was made and what to reuse (a signed envelope, install checks). Entries are written
atomically and never under ``<out>``; a store opened for writing only (``--fresh``, the stable
channel, ``CI`` set) makes entries but never answers from them. An entry that cannot be read is a
miss, never an error: the work is done again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any

from release.errors import WriteError
from release.util.atomic import atomic_write
from release.util.jsonfile import JsonFileError, read_json

SCHEMA = "activekv.reuse/v1"
# What a reused step prints: "<what> (reused: key 3f2a9c81d0e4, from the run at <time>)".
REUSED = "reused: key"
# The newest entries kept per kind and name; older ones are removed when one is added.
KEEP = 8
_SHORT = 12


def _plain(value: object) -> object:
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"expected JSON data in a reuse key; got {type(value).__name__}")


def canonical(inputs: Mapping[str, Any]) -> bytes:
    """The canonical JSON of `inputs`: sorted keys, no spaces, paths as text."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=_plain)
    return text.encode("utf-8")


def reuse_key(inputs: Mapping[str, Any]) -> str:
    """The sha256 of the canonical JSON of everything a result depends on."""
    return hashlib.sha256(canonical(inputs)).hexdigest()


def refusal(*, fresh: bool, operator_signed: bool, environ: Mapping[str, str] = os.environ) -> str:
    """Why a run must not read the store ("" when it may): `--fresh`; a channel signed with an
    operator's key (stable), which takes only what this run made or signed attestations of the
    same digests; a CI job (GitHub sets CI=true), whose state directory other jobs may share."""
    if fresh:
        return "--fresh"
    if operator_signed:
        return "the channel signs with an operator's key"
    if environ.get("CI", "").strip():
        return "CI is set"
    return ""


@dataclass(frozen=True)
class Hit:
    key: str
    made: str
    inputs: dict[str, Any]
    payload: dict[str, Any]

    def note(self) -> str:
        return f"{REUSED} {self.key[:_SHORT]}, from the run at {self.made}"


def changed(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The inputs that differ, by dotted name, two levels deep ("code.release/gates/parity.py",
    "manifest.gates"): what made a key miss."""
    found = []
    for name in sorted(set(before) | set(now)):
        old, new = before.get(name), now.get(name)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            found += [f"{name}.{part}" for part in sorted(set(old) | set(new))
                      if old.get(part) != new.get(part)]  # fmt: skip
        else:
            found.append(name)
    return found


class ReuseStore:
    """Entries under `root` (``<state_dir>/reuse``); `refused` says why none is read ("": read)."""

    def __init__(self, root: Path, refused: str = "") -> None:
        self.root = root
        self.refused = refused

    @property
    def reads(self) -> bool:
        return not self.refused

    def _folder(self, kind: str, name: str) -> Path:
        return self.root / kind / name

    def get(self, kind: str, name: str, inputs: Mapping[str, Any]) -> Hit | None:
        """The entry of the key of `inputs`, if the store is read and holds a readable one."""
        if not self.reads:
            return None
        key = reuse_key(inputs)
        return _read(self._folder(kind, name) / f"{key}.json", key)

    def latest(self, kind: str, name: str) -> Hit | None:
        """The newest entry of `name` (to say what changed since), whether the store is read
        or not: it only explains."""
        folder = self._folder(kind, name)
        paths = sorted(folder.glob("*.json"), key=_mtime, reverse=True) if folder.is_dir() else []
        for path in paths:
            if (hit := _read(path, path.stem)) is not None:
                return hit
        return None

    def put(self, kind: str, name: str, inputs: Mapping[str, Any],
            payload: Mapping[str, Any]) -> str:  # fmt: skip
        """Stores an entry under the key of its `inputs`; "" or, where it could not be
        written, why (the run goes on: a store that cannot be written only costs the next run
        its time)."""
        key = reuse_key(inputs)
        entry = {"schema": SCHEMA, "key": key, "made": _now(), "inputs": inputs,
                 "payload": payload}  # fmt: skip
        folder = self._folder(kind, name)
        try:
            atomic_write(folder / f"{key}.json", canonical(entry) + b"\n", mode=0o600)
        except WriteError as error:
            return str(error)
        for old in sorted(folder.glob("*.json"), key=_mtime, reverse=True)[KEEP:]:
            old.unlink(missing_ok=True)
        return ""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def _read(path: Path, key: str) -> Hit | None:
    try:
        data = read_json(path)
    except (FileNotFoundError, JsonFileError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("key") != key:
        return None
    made, inputs, payload = data.get("made"), data.get("inputs"), data.get("payload")
    if not (isinstance(made, str) and isinstance(inputs, dict) and isinstance(payload, dict)):
        return None
    if reuse_key(inputs) != key:  # an entry edited by hand is not what its name says
        return None
    return Hit(key, made, inputs, payload)
