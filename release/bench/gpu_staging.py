"""`python -m release gpu-staging`: the CUDA route's staging benchmark on this machine's GPU.

Builds tests/gpu/staging_bench.cpp (Release, host compiler and nvcc) from the same sources as the
wheel, runs it, and writes `<out>/gpu-staging.json`: the ceiling (a contiguous pinned copy, each
way and both at once), the baselines (per-block cudaMemcpyAsync, one cudaMemcpyBatchAsync, one per
layer, the staging kernels alone), the engine each way, loads and stores at once, and int8 against
exact tokens/s, in a random and a request-shaped scenario, with the rule's transfer path and each
forced one, all measured in that one run, with the GPU, the driver and the wheel built from these
sources. The bench's progress streams as it runs and is kept beside the record
(`<out>/gpu-staging.log`). ACTIVEKV_STAGING_BENCH names a bench binary built earlier from these
sources (a runner without a build toolchain, or one whose device time is short) instead of
building it here. Without a GPU it writes nothing and says "not run: no GPU runner".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from release.builder.cpptests import host_build, host_configure
from release.errors import GateError
from release.gpu import NO_GPU_RUNNER, detect_gpu, gpu_identity
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
    prebuilt = os.environ.get("ACTIVEKV_STAGING_BENCH")
    if prebuilt:
        binary, env = Path(prebuilt), dict(os.environ)
    else:
        build_dir = cache_dir / "gpu-bench"
        env = host_configure(
            manifest, source_dir=source_dir, cache_dir=cache_dir, build_dir=build_dir,
            build_type="Release", options=("-DACTIVEKV_BUILD_GPU_BENCH=ON",),
        )  # fmt: skip
        host_build(build_dir, env, TARGET)
        binary = build_dir / "tests" / "gpu" / TARGET
    console.print(f"gpu-staging: {binary} on {gpu}")
    returncode, stdout, stderr = _run_streaming(binary, env)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{GPU_STAGING_RECORD}.log").write_text(stderr)
    if returncode != 0:
        raise GateError(f"{binary}: exited {returncode}; see its output above")
    try:
        record = json.loads(stdout)
    except json.JSONDecodeError as error:
        raise GateError(
            f"{binary}: expected one JSON object on stdout; got {stdout[:200]!r} ({error})"
        ) from error
    record.update(
        driver=gpu_identity()["driver"],
        wheel=wheel.name,
        wheel_sha256=wheel.sha256,
        command="python -m release gpu-staging --wheel " + wheel.name,
    )
    write_measurement(out_dir, GPU_STAGING_RECORD, record)
    return record


def _run_streaming(binary: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Runs the bench, its progress (stderr) passed on line by line as it comes; its exit status,
    stdout and stderr."""
    process = subprocess.Popen(
        [str(binary)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    out, err = process.stdout, process.stderr
    if out is None or err is None:
        raise GateError(f"{binary}: no pipes to read its output from")
    stdout: list[str] = []
    # stdout is read on its own thread, so neither pipe can fill while the other is read.
    reader = threading.Thread(target=lambda: stdout.append(out.read()), daemon=True)
    reader.start()
    lines: list[str] = []
    for line in err:
        lines.append(line)
        sys.stderr.write(line)
        sys.stderr.flush()
    returncode = process.wait()
    reader.join()
    return returncode, "".join(stdout), "".join(lines)
