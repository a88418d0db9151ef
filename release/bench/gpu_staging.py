"""`python -m release gpu-staging`: the CUDA route's staging benchmark on this machine's GPU.

Builds tests/gpu/staging_bench.cpp (Release, host compiler and nvcc) from the same sources as the
wheel, runs it, and writes `<out>/gpu-staging.json`: the ceiling (a contiguous pinned copy, each
way and both at once), the baselines (per-block cudaMemcpyAsync, one cudaMemcpyBatchAsync, one per
layer, the staging kernels alone), the engine each way, loads and stores at once, and int8 against
exact tokens/s, all measured in that one run, with the GPU, the driver and the wheel built from
these sources. Without a GPU it writes nothing and says "not run: no GPU runner".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from release.build.cpptests import host_build, host_configure
from release.errors import GateError
from release.gates.gpu_runner import NO_GPU_RUNNER, detect_gpu
from release.gates.warmup import gpu_identity
from release.manifest import Manifest
from release.records import GPU_STAGING_RECORD, write_measurement
from release.util.progress import console
from release.wheelset import Wheel

TARGET = "activekv_staging_bench"


def run_gpu_staging(
    manifest: Manifest, *, source_dir: Path, cache_dir: Path, out_dir: Path, wheel: Wheel
) -> dict[str, Any] | None:
    """The record written, or None (and a message) on a machine without a GPU."""
    gpu = detect_gpu()
    if gpu is None:
        console.print(f"gpu-staging: {NO_GPU_RUNNER}")
        return None
    build_dir = cache_dir / "gpu-bench"
    env = host_configure(
        manifest, source_dir=source_dir, cache_dir=cache_dir, build_dir=build_dir,
        build_type="Release", options=("-DACTIVEKV_BUILD_GPU_BENCH=ON",),
    )  # fmt: skip
    host_build(build_dir, env, TARGET)
    binary = build_dir / "tests" / "gpu" / TARGET
    console.print(f"gpu-staging: {binary} on {gpu}")
    result = subprocess.run([str(binary)], capture_output=True, text=True, env=env)
    console.print(result.stderr, end="", markup=False, highlight=False)
    if result.returncode != 0:
        raise GateError(f"{binary}: exited {result.returncode}; see its output above")
    try:
        record = json.loads(result.stdout)
    except json.JSONDecodeError as error:
        raise GateError(
            f"{binary}: expected one JSON object on stdout; got {result.stdout[:200]!r} ({error})"
        ) from error
    record.update(
        driver=gpu_identity()["driver"],
        wheel=wheel.name,
        wheel_sha256=wheel.sha256,
        command="python -m release gpu-staging --wheel " + wheel.name,
    )
    write_measurement(out_dir, GPU_STAGING_RECORD, record)
    return record
