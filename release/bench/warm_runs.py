"""`python -m release.bench.warm_runs` (the end of `nox -s bench`): `python -m release run` cold,
again with nothing changed, and again after a README-only change, in one go, each printed as a
ratio to the cold run with what it reused and what ran again (docs/reuse.md).

It runs in a copy of this checkout as it is now (a clone of its commit with the files git hands on
laid over it), with a fresh cache and a fresh state directory in a temporary folder, so the cold
run is cold: no compiler cache, no wheel cache, no build tree, no keys, no index, no reuse store.
Only what the pipeline downloads by pinned name and digest (the framework wheels the payload gate
cites, the numpy each parity interpreter installs) is copied in from this checkout's cache,
unless `--download` says to fetch them too. `CI` is left out of the runs' environment: a CI job
reads no reuse store, and this measures the store.

The README-only change reaches the sdist (which holds every file git hands on) and not the
wheels; the index never replaces a published file, so that run publishes to a fresh index (the
earlier one set aside in the state directory).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from release.builder.reproduce import snapshot
from release.errors import ReleaseError
from release.util.paths import REPO_ROOT
from release.util.progress import console
from release.util.reuse import REUSED

TARGET = 0.1  # issue 37: a no-change re-run in at most a tenth of a cold one
# What the pipeline downloads by pinned name (never what it builds): copied into the cold cache.
DOWNLOADS = ("frameworks", "numpy")
_GATE_LINE = re.compile(r"^(?P<gate>[a-z][a-z0-9-]*): (?P<verdict>pass|fail|not-run)(?P<rest>.*)$")
_INSTALL_LINE = re.compile(r"\s+python \d+\.\d+\.\d+: .* digest matches its TUF target")


@dataclass
class Run:
    """One `run`: its wall time, exit status, and what it reused and ran, read from its output."""

    label: str
    seconds: float
    status: int
    log: Path
    reused: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    def read(self, text: str) -> None:
        installed = False
        for line in text.splitlines():
            found = _GATE_LINE.match(line.strip())
            if found:
                gate, verdict = found["gate"], found["verdict"]
                where = self.reused if REUSED in found["rest"] else self.ran
                where.append(gate if verdict == "pass" else f"{gate} ({verdict})")
            elif line.startswith("signed ") and " wheel(s)" in line:
                (self.reused if REUSED in line else self.ran).append("the signature")
            elif "installs below are those of a verify" in line:
                self.reused.append("verify's installs")
            elif _INSTALL_LINE.match(line):
                installed = True
        if installed and "verify's installs" not in self.reused:
            self.ran.append("verify's installs")


def _copy_checkout(destination: Path) -> Path:
    """This checkout's commit, cloned, with the files git hands on as they are now over it."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(destination)],
                   check=True, capture_output=True)  # fmt: skip
    return snapshot(REPO_ROOT, destination)


def _seed_downloads(cache: Path, source: Path) -> list[str]:
    seeded = []
    for name in DOWNLOADS:
        if (source / name).is_dir():
            shutil.copytree(source / name, cache / name, symlinks=True)
            seeded.append(name)
    return seeded


def _run(label: str, checkout: Path, work: Path, env: dict[str, str], number: int) -> Run:
    log = work / f"run-{number}-{label.split()[0]}.log"
    command = [sys.executable, "-m", "release", "run", "--out", str(work / "out"),
               "--state-dir", str(work / "state")]  # fmt: skip
    console.print(f"warm runs: {label} …", markup=False)
    started = time.monotonic()
    with log.open("w") as stream:
        done = subprocess.run(command, cwd=checkout, env=env, stdout=stream,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    run = Run(label, time.monotonic() - started, done.returncode, log)
    run.read(log.read_text(errors="replace"))
    console.print(f"warm runs: {label}: {run.seconds:.1f} s (exit {run.status}; log {log})",
                  markup=False)  # fmt: skip
    return run


def _set_index_aside(state: Path) -> None:
    """The index and what verify trusted of it, moved aside: the README run publishes a new
    sdist under the same version, which an index never takes over a published one."""
    for name in ("index", "verify-tuf-cache"):
        if (state / name).exists():
            (state / name).rename(state / f"{name}.before-readme")


def _report(cold: Run, runs: Sequence[Run]) -> bool:
    console.print(f"cold run: {cold.seconds:.1f} s (fresh caches and state; gates, sign, publish "
                  "and verify all ran)", markup=False)  # fmt: skip
    met = True
    for run in runs:
        ratio = run.seconds / cold.seconds
        console.print(f"{run.label}: {run.seconds:.1f} s = {ratio:.3f} x the cold run",
                      markup=False)  # fmt: skip
        console.print(f"  reused: {', '.join(run.reused) or 'nothing'}", markup=False)
        console.print(f"  ran: {', '.join(run.ran) or 'nothing'}", markup=False)
        if run is runs[0]:
            met = ratio <= TARGET
            console.print(f"  target: at most {TARGET} x the cold run: "
                          f"{'met' if met else 'NOT met'}", markup=False)  # fmt: skip
    console.print(
        "  README.md is not the long description (DESCRIPTION.md is): the wheels do not change; "
        "it is in the sdist, so the gate that judges the sdist (payload), the signature, the "
        "publish (to a fresh index: a published sdist is never replaced) and verify ran again",
        markup=False, soft_wrap=True,
    )  # fmt: skip
    return met


def warm_runs(work: Path, *, download: bool) -> int:
    checkout = _copy_checkout(work / "checkout")
    cache = work / "cache"
    cache.mkdir()
    user_cache = Path(os.environ.get("ACTIVEKV_CACHE_DIR") or REPO_ROOT / ".activekv" / "cache")
    seeded = [] if download else _seed_downloads(cache, user_cache)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["ACTIVEKV_CACHE_DIR"] = str(cache)
    console.print(f"warm runs in {work}: a copy of {REPO_ROOT}, a fresh cache"
                  + (f" (downloads copied in: {', '.join(seeded)})" if seeded else "")
                  + " and a fresh state directory", markup=False, soft_wrap=True)  # fmt: skip
    cold = _run("cold run", checkout, work, env, 1)
    if cold.status != 0:
        raise ReleaseError(f"warm runs: the cold run failed (exit {cold.status}); see {cold.log}")
    again = _run("no-change re-run", checkout, work, env, 2)
    readme = checkout / "README.md"
    readme.write_text(readme.read_text() + "\nA README-only change (release.bench.warm_runs).\n")
    _set_index_aside(work / "state")
    changed = _run("README-only change", checkout, work, env, 3)
    failed = [run for run in (again, changed) if run.status != 0]
    met = _report(cold, [again, changed])
    for run in failed:
        console.print(f"{run.label}: exit {run.status}; see {run.log}", markup=False)
    return 1 if failed or not met else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.bench.warm_runs",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="work in DIR (new or empty) and keep it, logs included")  # fmt: skip
    parser.add_argument(
        "--download",
        action="store_true",
        help="copy no download into the cold cache: fetch them as a new user",
    )
    args = parser.parse_args(argv)
    try:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            if any(args.keep.iterdir()):
                raise ReleaseError(f"--keep {args.keep}: expected a new or empty folder")
            return warm_runs(args.keep.resolve(), download=args.download)
        with tempfile.TemporaryDirectory(prefix="activekv-warm-runs-") as work:
            return warm_runs(Path(work), download=args.download)
    except ReleaseError as error:
        console.print(f"error: {error}", markup=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
