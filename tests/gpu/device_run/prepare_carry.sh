#!/usr/bin/env bash
# Fills .activekv/gpu-carry (git-ignored) for gpu_run.sh on the H200, from this checkout, on the
# workstation: the cp312 wheel of these sources, the staging bench and the route tests built from
# the same sources, the gpu-runner group's wheels for cp312, and gpu_run.sh itself.
#   bash tests/gpu/device_run/prepare_carry.sh [PYTHON]   (PYTHON: the dev venv's, with `release`)
# Then: run(command="bash .activekv/gpu-carry/gpu_run.sh check", carry=[".activekv/gpu-carry"]).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
PY=${1:-$ROOT/.nox/tests/bin/python}
export PATH=$(dirname "$PY"):$PATH  # the venv's cmake and ninja, the versions the build pins
CARRY=$ROOT/.activekv/gpu-carry
BUILD=$ROOT/.activekv/cache/gpu-bench
mkdir -p "$CARRY/bin" "$CARRY/wheelhouse"

# The wheel (cached by the sources' digest: unchanged sources are not compiled again).
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$PY" -m release build --python 3.12 --out "$OUT"
rm -f "$CARRY"/activekv-*.whl
cp "$OUT"/wheels/activekv-*-cp312-*.whl "$CARRY/"

# The bench and the route tests, Release, the host toolchain the GPU gates use.
"$PY" - "$ROOT" "$BUILD" <<'EOF'
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
EOF
cp "$BUILD/tests/gpu/activekv_staging_bench" "$BUILD/tests/cpp/test_cuda_route" "$CARRY/bin/"

# The gpu-runner group for the H200's Python 3.12 (no network there), and ninja.
PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --dest "$CARRY/wheelhouse" pydantic==2.14.4 rich==15.0.0 packaging==26.4 \
  'securesystemslib[crypto]==1.6.0' numpy==2.2.6 ninja pip

cp tests/gpu/device_run/gpu_run.sh "$CARRY/"
(cd "$CARRY" && sha256sum activekv-*.whl bin/* gpu_run.sh > SHA256SUMS)
git log --oneline -1 > "$CARRY/COMMIT"
du -sh "$CARRY"
cat "$CARRY/SHA256SUMS"
