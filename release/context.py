"""Where one invocation of the pipeline works: its manifest, checkout, outputs and state."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from release.errors import GateError
from release.manifest import ChannelSpec, Manifest
from release.records import BuildRecord, read
from release.util.pins import project_version
from release.wheelset import WheelSet


@dataclass(frozen=True)
class Context:
    manifest: Manifest
    source_dir: Path
    out_dir: Path
    state_dir: Path
    channel_name: str | None = None  # --channel; None: the manifest's default channel
    key_dir: Path | None = None  # --key-dir: the stable keys as `keygen` made them
    attest_key: Path | None = None  # --attest-key: a runner's key for gate attestations

    @property
    def wheels_dir(self) -> Path:
        return self.out_dir / "wheels"

    @property
    def cache_dir(self) -> Path:
        """Compiler caches, build trees and built wheels by input digest: safe to share."""
        return Path(os.environ.get("ACTIVEKV_CACHE_DIR") or self.state_dir / "cache").resolve()

    @property
    def envelope_path(self) -> Path:
        return (
            self.out_dir
            / "provenance"
            / f"{self.manifest.release.name}-{project_version()}.intoto.json"
        )

    def channel(self, name: str | None) -> tuple[str, ChannelSpec]:
        chosen = self.manifest.release.default_channel if name is None else name
        return chosen, self.manifest.channel(chosen)

    def wheel_files(self) -> list[Path]:
        """The wheel files under `<out>/wheels/`, whatever made them."""
        wheels = sorted(self.wheels_dir.glob("*.whl"))
        if not wheels:
            raise GateError(
                f"{self.wheels_dir}: expected built wheels; run `python -m release build`"
            )
        return wheels

    def built_wheels(self) -> WheelSet:
        """The wheels of the last build as its record names them, each hashed again to match."""
        self.wheel_files()
        return WheelSet.from_build(read(self.out_dir, BuildRecord), self.wheels_dir)

    def wheels_given(self, paths: list[Path], named_by: str = "--wheel") -> WheelSet:
        """The wheels named on the command line (by `named_by`), else the built ones."""
        if not paths:
            return self.built_wheels()
        return WheelSet.from_files(self.manifest, paths, named_by)
