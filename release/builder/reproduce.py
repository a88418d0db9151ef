"""The reproducible gate: build every wheel twice, from two copies of the source at different
paths, each in fresh build trees with no compiler or wheel cache, and require bit-identical
wheels (and the same bytes as the release's own wheels, when they exist).

When two wheels differ it names each differing member and its first differing byte.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from release.builder.wheels import build_wheels, plan_targets, source_date_epoch
from release.errors import GateError
from release.evidence import Evidence, write_evidence
from release.manifest import Manifest
from release.util.digests import sha256_file
from release.util.progress import step
from release.util.wheel_diff import wheel_differences

# The second copy sits deeper and under another name, so any path that leaks into a wheel shows.
_COPIES = (("a", Path("a") / "activekv"), ("b", Path("b") / "elsewhere" / "src-of-activekv"))


def snapshot(source_dir: Path, destination: Path) -> Path:
    """Copies what the build reads: tracked files and untracked ones git does not ignore."""
    listing = subprocess.run(
        ["git", "-C", str(source_dir), "ls-files", "-z", "--cached", "--others",
         "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listing.split("\0")):
        source = source_dir / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def run_reproduce_gate(
    manifest: Manifest,
    *,
    source_dir: Path,
    out_dir: Path,
    cache_dir: Path,
    only: Sequence[str] = (),
) -> Evidence:
    epoch = source_date_epoch(source_dir)
    plan_targets(manifest, only)  # a version the manifest does not declare: refused before copying
    root = out_dir / "reproduce"
    shutil.rmtree(root, ignore_errors=True)
    builds: dict[str, dict[str, Path]] = {}
    for index, (label, relative) in enumerate(_COPIES, 1):
        copy = snapshot(source_dir, root / relative)
        with step(f"reproduce: build {label} from {copy}", count=(index, len(_COPIES))):
            report = build_wheels(
                manifest, source_dir=copy, out_dir=root / f"out-{label}", cache_dir=cache_dir,
                only=only, fresh_build_root=root / f"build-{label}", epoch=epoch,
            )  # fmt: skip
        builds[label] = {wheel.path.name: wheel.path for wheel in report.wheels}
    first, second = builds["a"], builds["b"]
    if set(first) != set(second):
        raise GateError(
            f"the two builds made different wheels: {sorted(first)} and {sorted(second)}"
        )
    problems: list[str] = []
    for name in sorted(first):
        if sha256_file(first[name]) != sha256_file(second[name]):
            problems += [f"{name}: {d}" for d in wheel_differences(first[name], second[name])]
    released = {w.name: w for w in (out_dir / "wheels").glob("*.whl")}
    if not only:
        # Every release wheel must be one of the rebuilt ones: a pass must cover what ships.
        made = ", ".join(sorted(first))
        problems += [
            f"{name} (release build): the rebuild made no wheel of that name (it made {made})"
            for name in sorted(set(released) - set(first))
        ]
    for name in sorted(set(first) & set(released)):
        if sha256_file(first[name]) != sha256_file(released[name]):
            problems += [f"{name} (release build): {d}"
                         for d in wheel_differences(released[name], first[name])]  # fmt: skip
    evidence = Evidence(
        gate="reproducible",
        verdict="fail" if problems else "pass",
        artefacts={name: sha256_file(path) for name, path in sorted(first.items())},
        figures={
            "source_date_epoch": epoch,
            "copies": [str(root / relative) for _, relative in _COPIES],
            "compared_with_release": sorted(set(first) & set(released)),
            "differences": problems,
        },
        reason="; ".join(problems[:20]),
    )
    write_evidence(out_dir, evidence)
    return evidence
