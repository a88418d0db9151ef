"""activekv._fabric as the built wheel ships it, on a machine without a GPU (CI).

Each route that needs a GPU, libcublas or libcupti must fail with an error naming what is
missing, never crash; the GPU behaviour itself is proven by the warm-up gate on the GPU machine
(tests/gpu/evidence/) and by the C++ tests there.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from release.gates.warmup import library_candidates
from release.gpu import detect_gpu

no_gpu = pytest.mark.skipif(detect_gpu() is not None, reason="this machine has a GPU")


@pytest.fixture(scope="module")
def fabric(activekv_site: Path) -> ModuleType:
    module = importlib.import_module("activekv._fabric")
    assert activekv_site.resolve() in Path(module.__file__).resolve().parents
    return module


def test_the_callback_classifier_is_the_native_one(fabric: ModuleType) -> None:
    assert fabric.classify_api("cudaMallocAsync_ptsz_v11020") == "async_allocation"
    assert fabric.classify_api("cuMemCreate") == "vmm_allocation"
    assert fabric.classify_api("cudaStreamBeginCaptureToGraph_v12030") == "stream_capture"
    assert fabric.classify_api("cudaMemcpyAsync_v3020") is None
    assert fabric.base_api_name("cuStreamSynchronize_ptsz") == "cuStreamSynchronize"


def test_error_types_are_runtime_errors(fabric: ModuleType) -> None:
    for name in (
        "ArenaSealedError",
        "ArenaExhaustedError",
        "StreamRuleError",
        "ConventionProbeError",
        "CudaError",
        "LibraryLoadError",
        "LibraryCallError",
    ):
        assert issubclass(getattr(fabric, name), RuntimeError), name  # fmt: skip
    assert fabric.has_tensorrt_executor is False  # no TensorRT SDK on this workplace


def test_missing_libcupti_is_named(fabric: ModuleType) -> None:
    with pytest.raises(fabric.LibraryLoadError) as raised:
        fabric.CuptiMonitor(["/nonexistent/libcupti.so.13", "libno-such-cupti.so"])
    message = str(raised.value)
    assert "libcupti could not be loaded; tried 2 candidate(s)" in message
    assert "/nonexistent/libcupti.so.13" in message


def test_missing_libcublas_is_named_before_any_cuda_call(fabric: ModuleType) -> None:
    with pytest.raises(fabric.LibraryLoadError, match="libcublas could not be loaded"):
        fabric.DecodeWorker(["/nonexistent/libcublas.so.13"])
    with pytest.raises(fabric.LibraryLoadError, match="lacks the symbol cublasCreate_v2"):
        fabric.DecodeWorker(["libc.so.6"])


def test_bad_worker_arguments_are_named(fabric: ModuleType) -> None:
    with pytest.raises(ValueError, match='executor_mixing: expected "causal" or "none"'):
        fabric.DecodeWorker(["libc.so.6"], executor_mixing="sideways")
    with pytest.raises(ValueError, match="hidden: expected at least 1; got 0"):
        fabric.DecodeWorker(["libc.so.6"], hidden=0)
    # Checked before any library is loaded, each naming its argument (not nanobind's TypeError).
    for argument, value, expected in (
        ("batch", -1, "batch: expected a non-negative integer below 2\\*\\*64; got -1"),
        ("model_seed", 2**64, "model_seed: expected a non-negative integer below 2\\*\\*64"),
        ("device", -1, "device: expected a CUDA device ordinal"),
        ("workspace_bytes", 2**41, "workspace_bytes: expected at most 1099511627776"),
    ):
        with pytest.raises(ValueError, match=expected):
            fabric.DecodeWorker(["/nonexistent/libcublas.so.13"], **{argument: value})
    with pytest.raises(ValueError, match="batch \\* slots \\* hidden: 4294967296 floats"):
        fabric.DecodeWorker(["/nonexistent/libcublas.so.13"], batch=131072, slots=1,
                            hidden=32768, ffn=1)  # fmt: skip


@no_gpu
def test_without_a_gpu_the_worker_names_the_cuda_error(fabric: ModuleType) -> None:
    cublas = [c for c in library_candidates("cublas") if Path(c).is_file()]
    if not cublas:
        pytest.skip("no libcublas on this machine: the worker stops at loading it (tested above)")
    with pytest.raises(fabric.CudaError, match="cudaGetDeviceCount"):
        fabric.DecodeWorker(cublas)


@no_gpu
def test_without_a_gpu_cupti_refuses_to_subscribe_cleanly(fabric: ModuleType) -> None:
    cupti = [c for c in library_candidates("cupti") if Path(c).is_file()]
    if not cupti:
        pytest.skip("no libcupti on this machine: loading it is refused (tested above)")
    # libcupti loads and its callback names classify; subscribing needs a driver.
    with pytest.raises(fabric.LibraryCallError, match="cuptiSubscribe failed"):
        fabric.CuptiMonitor(cupti)


def test_the_arena_plan_still_seals(fabric: ModuleType) -> None:
    plan = fabric.ArenaPlan()
    with pytest.raises(ValueError, match="bytes: expected a non-negative integer"):
        plan.reserve("kv", -1)
    assert plan.reserve("kv", 100) == 0
    plan.seal()
    with pytest.raises(fabric.ArenaSealedError, match="refused after warm-up"):
        plan.reserve("late", 1)
    assert plan.refused_after_seal == 1
