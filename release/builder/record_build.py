"""`python -m release record-build`: `<out>/build.json` for wheels built elsewhere.

In CI the wheels are built by cibuildwheel in a matrix and handed to the release job as files;
signing needs the record `python -m release build` would have written: each wheel, the Python
versions it serves, its size and sha256, SOURCE_DATE_EPOCH and the toolchain. This step writes
it from the wheels themselves, refusing a wheel for a Python version the manifest does not declare,
with the sdist the step builds from the checkout it runs in (release/steps.py).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from release.builder.wheels import source_date_epoch
from release.records import BuildRecord, BuiltWheelEntry, SdistEntry
from release.source_state import source_state
from release.util.pins import pinned_version
from release.wheelset import WheelSet


def record_build(
    wheels: WheelSet, source_dir: Path, sdist: SdistEntry | None = None
) -> BuildRecord:
    now = datetime.now(timezone.utc)
    cibuildwheel = pinned_version("build", "cibuildwheel") or "unknown"
    return BuildRecord(
        started=now,
        finished=now,
        source_date_epoch=source_date_epoch(source_dir),
        # The checkout the job recording them runs in, at the commit the wheels were built from.
        source=source_state(source_dir).record(),
        toolchain={"kind": "cibuildwheel", "cibuildwheel": cibuildwheel},
        wheels=tuple(
            BuiltWheelEntry(
                file=w.name,
                python=w.python,
                serves=w.serves,
                seconds=0.0,
                cached=False,
                size=w.size,
                sha256=w.sha256,
            )
            for w in wheels
        ),
        sdist=sdist,
    )
