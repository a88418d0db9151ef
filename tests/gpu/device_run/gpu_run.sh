#!/usr/bin/env bash
# The engine's GPU checks and staging benches on a lent H200 (no network there), from the
# repository root of a checkout with .activekv/gpu-carry carried (this folder: the wheel, the
# wheelhouse, two binaries; tests/gpu/device_run/prepare_carry.sh fills it).
#   bash .activekv/gpu-carry/gpu_run.sh check   route tests, gpu-gates, parity per forced path
#   bash .activekv/gpu-carry/gpu_run.sh bench   C++ staging bench, then the Python-API bench
#   bash .activekv/gpu-carry/gpu_run.sh attest  the GPU gates on every carried wheel, each in an
#     interpreter of its version, signed by a runner key made here (prepare_carry.sh --attest)
#   bash .activekv/gpu-carry/gpu_run.sh replay  the generated workflow's GPU job, replayed
#     (`python -m release ci --replay --job gpu-gates`) at HEAD plus one commit made here that
#     pins a runner key made here, on the wheels job's artifacts (prepare_carry.sh --replay)
#   (all: both; bench-first: both, the benches first; evidence: gpu-gates and bench)
# Each step's exit status goes to status.txt (a failing step does not stop the ones after it).
# The device tool brings back at most 8 files from $OUT, so the results are kept in $WORK and
# packed into $OUT/results.tar.gz after every step (what a timeout cut short still comes back);
# $OUT/status.txt and $OUT/current.log (the running step's output) travel beside it.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
: "${OUT:?set OUT}"
# Outside the checkout's state folder (.activekv): the pipeline refuses outputs inside it.
WORK=${TMPDIR:-/tmp}/activekv-gpu-out
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK"
WHEEL=$(find "$HERE" -name 'activekv-*-abi3-*.whl' | head -1)  # the one the image's 3.12 installs
VENV=$ROOT/.activekv/gpu-venv
SITE=$ROOT/.activekv/gpu-site
export ACTIVEKV_WHEELHOUSE=$HERE/wheelhouse
START=$(date +%s)

note() {
  echo "[gpu_run $(( $(date +%s) - START ))s] $*" | tee -a "$WORK/status.txt" >&2
  cp "$WORK/status.txt" "$OUT/status.txt"
}
step() {  # step NAME SECONDS COMMAND...: runs it for at most SECONDS (a hung step leaves the
          # others their time), its output in $WORK/NAME.log, then packs $WORK
  local name=$1 seconds=$2; shift 2
  note "start $name (at most ${seconds}s)"
  timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$OUT/current.log"
  note "end $name rc=${PIPESTATUS[0]}"
  cp "$OUT/current.log" "$WORK/$name.log"
  tar -czf "$OUT/results.tar.gz" -C "$WORK" .
}

setup_venv() {
  (cd "$HERE" && sha256sum -c --quiet SHA256SUMS) || { note "the carry's SHA256SUMS do not match"; exit 1; }
  # CUPTI and cuBLAS of the image's torch venv (the new venv below does not see its site).
  local torch_lib
  torch_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13/lib
  [ -f "$torch_lib/libcupti.so.13" ] && export ACTIVEKV_CUPTI_LIBRARY=$torch_lib/libcupti.so.13
  [ -f "$torch_lib/libcublas.so.13" ] && export ACTIVEKV_CUBLAS_LIBRARY=$torch_lib/libcublas.so.13
  if [ ! -x "$VENV/bin/python" ]; then
    # Without ensurepip on the image, a venv without pip gets pip from the wheelhouse.
    python3 -m venv "$VENV" 2>/dev/null || {
      rm -rf "$VENV"
      python3 -m venv --without-pip "$VENV" &&
        "$VENV/bin/python" "$(ls "$HERE"/wheelhouse/pip-*.whl)/pip" install -q --no-index \
          "$HERE"/wheelhouse/pip-*.whl
    } || { note "python3 -m venv failed"; exit 1; }
    # pyproject's gpu-runner group (`--group` needs pip >= 25.1: the carried pip first), and
    # ninja where the carry has it (for building the bench here).
    local ninja=()
    ls "$HERE"/wheelhouse/ninja-*.whl >/dev/null 2>&1 && ninja=(ninja)
    "$VENV/bin/python" -m pip install -q --no-index --find-links "$HERE/wheelhouse" -U pip &&
      "$VENV/bin/python" -m pip install -q --no-index --find-links "$HERE/wheelhouse" \
        --group "$ROOT/pyproject.toml:gpu-runner" "${ninja[@]}" ||
      { note "pip install from the wheelhouse failed"; exit 1; }
  fi
  PY=$VENV/bin/python
}

setup() {
  setup_venv
  export PATH=$VENV/bin:$PATH  # ninja, for building the bench here if it comes to that
  rm -rf "$SITE"
  "$VENV/bin/python" -m pip install -q --no-deps --no-index --target "$SITE" "$WHEEL" ||
    { note "installing the wheel failed"; exit 1; }
  {
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader
    (cd "$HERE" && sha256sum activekv-*.whl)
    cat "$HERE/COMMIT"
    echo "CUPTI ${ACTIVEKV_CUPTI_LIBRARY:-(searched)} cuBLAS ${ACTIVEKV_CUBLAS_LIBRARY:-(searched)}"
  } > "$WORK/identity.txt" 2>&1
}

# The GPU cells and the request-shaped cells: where the forced paths differ from the rule's.
CELLS=(gpu-exact-bf16-t16-h8d128-l8 gpu-exact-fp16-t16-h8d128-l8-faults-pressure
       gpu-int8-bf16-t16-h8d128-l8-faults gpu-fp8-bf16-t16-h8d96-l8-faults-pressure
       exact-bf16-t16-h2d64-l2-requests-fragmented int8-fp16-t8-h2d32-l3-requests-faults
       exact-fp32-t4-h2d16-l2-requests-tight fp8-bf16-t16-h2d32-l2-requests-fragmented
       exact-bf16-t32-h2d128-l2 exact-bf16-t1-h1d8-l1)

gates() {
  # The warm-up gate (CUPTI: zero allocations, syncs, captures over the steady steps, now with
  # request-shaped staging loads) and GPU parity (all cells, the rule's paths).
  step gpu-gates 270 "$PY" -m release gpu-gates --wheel "$WHEEL" --out "$WORK/gates"
}

check() {
  # Every transfer path (forced in turn) against the CPU route, bit for bit, every mode x dtype.
  step test_cuda_route 150 "$HERE/bin/test_cuda_route"
  # Its GPU cases pass vacuously without a device: say so if they did.
  grep -q "not run: no GPU" "$WORK/test_cuda_route.log" && note "test_cuda_route saw no GPU"
  gates
  local cell_args=() path
  for cell in "${CELLS[@]}"; do cell_args+=(--cell "$cell"); done
  # runs-staged differs from runs only in direct runs, which test_cuda_route forces both ways.
  for path in runs runs-batched block-copies; do
    ACTIVEKV_CUDA_TRANSFER_PATH=$path step "parity-$path" 45 "$PY" -m release parity \
      --device cuda --wheel "$WHEEL" --out "$WORK/parity-$path" "${cell_args[@]}"
  done
}

bench() {
  # The C++ bench (the binary built from these sources on the workstation; set
  # ACTIVEKV_STAGING_BENCH empty to build it here instead, ~1-2 min more).
  # Forced-path rows: runs-staged only differs from runs where device blocks are consecutive
  # (ACTIVEKV_BENCH_DEVICE_RUNS=1), so it is left out unless asked for.
  ACTIVEKV_STAGING_BENCH=${ACTIVEKV_STAGING_BENCH-$HERE/bin/activekv_staging_bench} \
  ACTIVEKV_BENCH_PATHS=${ACTIVEKV_BENCH_PATHS-kernels,block-copies,runs,runs-batched} \
    step gpu-staging 400 "$PY" -m release gpu-staging --wheel "$WHEEL" --out "$WORK"
  local ceiling=()
  [ -f "$WORK/gpu-staging.json" ] && ceiling=(--ceiling "$WORK/gpu-staging.json")
  # The Python API: the rule's path only, unless PY_BENCH_PATHS names forced ones (~+5 s each
  # per block size).
  local in_order=()
  [ "${ACTIVEKV_BENCH_DEVICE_RUNS:-}" = 1 ] && in_order=(--device-runs)
  step staging-py 240 "$PY" -m release.scripts.staging_bench_py --site "$SITE" \
    --wheel "$WHEEL" --out "$WORK/staging-py.json" --paths "${PY_BENCH_PATHS-}" "${ceiling[@]}" "${in_order[@]}"
}

unpack_pythons() {  # the carried CPythons under .activekv/gpu-pythons; PYTHONS: their interpreters
  PYTHONS=()
  rm -rf "$ROOT/.activekv/gpu-pythons"
  mkdir -p "$ROOT/.activekv/gpu-pythons"
  for archive in "$HERE"/pythons/cpython-*.tar.xz; do
    [ -f "$archive" ] || continue
    tar -xJf "$archive" -C "$ROOT/.activekv/gpu-pythons" || { note "unpacking $archive failed"; exit 1; }
  done
  for python in "$ROOT"/.activekv/gpu-pythons/cpython-*/bin/python3.*; do
    [ -x "$python" ] && PYTHONS+=("$python")
  done
}

runner_name() {  # h100-runner-<UTC>: the GPU's model and the time
  local gpu
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' |
        grep -oE '[a-z]+[0-9]+[a-z]*' | grep -vE '^(nvidia|pcie|sxm[0-9]*|nvl|hbm[0-9a-z]*)$' | head -1)
  echo "${gpu:-gpu}-runner-$(date -u +%Y%m%d-%H%M)"
}

attest() {
  # The GPU gates (warm-up under CUPTI, GPU parity on every cell) on every carried wheel: the
  # abi3 one in this venv's 3.12, each other in its carried CPython. Their attestations are
  # signed by a runner key made here, whose private half never leaves this machine (it is kept
  # outside $WORK, which is packed): the manifest then pins the public half that comes back.
  local pythons=() wheels=() name keys=$ROOT/.activekv/runner-key
  rm -rf "$keys"
  unpack_pythons
  for python in "${PYTHONS[@]}"; do pythons+=(--python "$python"); done
  for wheel in "$HERE"/activekv-*.whl; do wheels+=(--wheel "$wheel"); done
  name=$(runner_name)
  # The gates run from HEAD's tree (head.tar.gz), not the checkout that travelled beside it.
  local head=$ROOT/.activekv/gpu-head
  rm -rf "$head" && mkdir -p "$head" && tar -xzf "$HERE/head.tar.gz" -C "$head" ||
    { note "unpacking head.tar.gz failed"; exit 1; }
  cp "$HERE/COMMIT" "$WORK/"
  (cd "$head" && step keygen 60 "$PY" -m release keygen --runner "$name" "$keys")
  [ -f "$keys/$name.pub.json" ] || { note "keygen made no key"; exit 1; }
  cp "$keys/$name.pub.json" "$WORK/"
  (cd "$head" && step gpu-gates 520 "$PY" -m release gpu-gates "${wheels[@]}" "${pythons[@]}" \
    --attest-key "$keys/$name.pem" --out "$WORK/gates" --state-dir "$ROOT/.activekv/gpu-state")
}

replay() {
  # The GPU runner, provisioned as an offline self-hosted runner: its tool cache's interpreters
  # are the carried CPythons (setup-python's stand-in finds them on PATH), pip's index is the
  # wheelhouse, and its framework cache holds each CPython's numpy (parity's children import
  # it; the carried wheelhouse has numpy for 3.12 only). The key it signs with is made here and
  # pinned in one commit on top of HEAD, which the GPU job is replayed at; that commit comes
  # back as a git bundle, with the job's records, for the release job on the workstation.
  local keys=$ROOT/.activekv/runner-key repo=$ROOT/.activekv/gpu-repo cache=$ROOT/.activekv/gpu-cache
  local runner=$ROOT/.activekv/gpu-runner name base numpy version site
  rm -rf "$keys" "$repo" "$cache" "$runner" "$ROOT/.activekv/gpu-replay"
  unpack_pythons
  git clone -q "$HERE/repo.git" "$repo" || { note "cloning the carried repository failed"; exit 1; }
  numpy=$(cd "$repo" && "$PY" -c 'from release.util.pins import pinned_version as v; print(v("gpu-runner", "numpy"))')
  for python in "${PYTHONS[@]}"; do
    export PATH=$PATH:$(dirname "$python")  # after the image's: python3 stays its own
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    site=$("$python" -c 'import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))')
    mkdir -p "$cache/numpy/$version-$numpy"
    cp -r "$site"/numpy "$site"/numpy.libs "$site"/numpy-*.dist-info "$cache/numpy/$version-$numpy/"
  done
  base=$(git -C "$repo" rev-parse HEAD)
  name=$(runner_name)
  (cd "$repo" && step keygen 60 "$PY" -m release keygen --runner "$name" "$keys")
  [ -f "$keys/$name.pub.json" ] || { note "keygen made no key"; exit 1; }
  cp "$keys/$name.pub.json" "$WORK/"
  (cd "$repo" && step pin 60 "$PY" tests/gpu/device_run/take_attestations.py --pin "$keys/$name.pub.json") ||
    { note "pinning the runner key failed"; exit 1; }
  git -C "$repo" add -A manifests &&
    git -C "$repo" -c user.name="ActiveKV GPU runner" -c user.email=gpu-runner@activekv.invalid \
      commit -q -m "GPU runner key $name, made on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), pinned as the gpu attester" ||
    { note "committing the pin failed"; exit 1; }
  git -C "$repo" bundle create -q "$WORK/pin.bundle" "$base..HEAD" ||
    { note "bundling the pin commit failed"; exit 1; }
  git -C "$repo" log --oneline -2 > "$WORK/COMMIT"
  # The replay itself runs from that commit's tree too, not the checkout that travelled.
  (cd "$repo" && ACTIVEKV_RUNNER_KEY=$keys/$name.pem ACTIVEKV_CACHE_DIR=$cache PIP_NO_INDEX=1 \
    PIP_FIND_LINKS=$HERE/wheelhouse PIP_DISABLE_PIP_VERSION_CHECK=1 \
    step replay 560 "$PY" -m release ci --replay --channel stable --job gpu-gates \
      --from-run "$HERE/run" --repo "$repo" --commit HEAD --work "$ROOT/.activekv/gpu-replay" \
      --runner-dir "$runner")
  local records=$ROOT/.activekv/gpu-replay/artifacts/gpu-records/gpu-records.tar
  mkdir -p "$WORK/gates" "$WORK/gpu-records"
  cp "$ROOT/.activekv/gpu-replay/summary.md" "$WORK/" 2>/dev/null
  cp -r "$ROOT/.activekv/gpu-replay/logs" "$WORK/replay-logs" 2>/dev/null
  if [ -f "$records" ]; then
    cp "$records" "$WORK/gpu-records/"
    tar -xf "$records" -C "$WORK/gates"
    cp "$WORK/replay-logs/gpu-gates.log" "$WORK/gpu-gates.log" 2>/dev/null
  else
    note "the GPU job left no gpu-records artifact"
  fi
  tar -czf "$OUT/results.tar.gz" -C "$WORK" .
}

if [ "${1:-}" = replay ]; then
  setup_venv
  "$PY" -m pip install -q --no-index --no-deps --find-links "$HERE/wheelhouse" ruamel.yaml tuf urllib3 ||
    { note "installing the replay's own dependencies failed"; exit 1; }
  {
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader
    find "$HERE/run" -name '*.whl' -exec sha256sum {} +
  } > "$WORK/identity.txt" 2>&1
  replay
  note "done"
  exit 0
fi
setup
case "${1:-}" in
  check) check ;;
  bench) bench ;;
  all) check; bench ;;
  bench-first) bench; check ;;  # the figures first where the call's time is short
  evidence) gates; bench ;;  # the final wheel's record: gates and both benches, one run
  attest) attest ;;
  *) echo "usage: $0 check|bench|all|bench-first|evidence|attest" >&2; exit 2 ;;
esac
note "done"
