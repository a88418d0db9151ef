"""One check of the KV-cache tensors handed to an engine (bindings/kv_views.h).

`activekv._engine.Engine.register_kv_caches` and the vLLM connector core's `register_kv_caches`
(`activekv._vllm`) take the same arrays and refuse the same ones, with the same message after the
name of the argument and one error type, `activekv._engine.EngineInputError` (a ValueError).
Before, each binding checked on its own: the core took any element type of the right width, named
neither the strides nor the device it got, and raised its own ConnectorConfigError.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_served_path import BLOCK, BLOCKS, HEAD_DIM, HEADS, LAYERS, configs

from reference import engine as reference

SHAPE = (2, BLOCKS, BLOCK, HEADS, HEAD_DIM)
TORCH_DTYPES = {"fp16": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32"}
WORDS = {"fp16": np.uint16, "bf16": np.uint16, "fp32": np.uint32}


@pytest.fixture(scope="module")
def modules(activekv_site: Any) -> tuple[Any, Any]:
    """activekv._engine and activekv._vllm from the wheel under test."""
    import activekv._engine as engine
    import activekv._vllm as vllm

    return engine, vllm


def bindings(modules: tuple[Any, Any], dtype: str) -> tuple[Any, Any]:
    """An engine and a connector worker of the same geometry, of KV `dtype`."""
    native, vllm = modules
    layout = native.KvBlockLayout(
        len(LAYERS), BLOCK, HEADS, HEAD_DIM, getattr(native.KvDtype, dtype)
    )
    engine = native.Engine(layout, "exact", 1 << 20, 2, 8, BLOCKS)
    vllm_config, kv_cache_config = configs(f"kv-views-{dtype}", dtype=TORCH_DTYPES[dtype])
    worker = vllm.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)
    return engine, worker


def _read_only(good: np.ndarray) -> np.ndarray:
    array = good.copy()
    array.flags.writeable = False
    return array


BAD: dict[str, tuple[str, Callable[[np.ndarray], Any]]] = {
    # (the KV dtype, the bad layer made from a good one)
    "signed words": ("fp16", lambda good: good.view(np.int16)),
    "float16 under bf16": ("bf16", lambda good: good.view(np.float16)),
    "wider words": ("fp16", lambda good: good.astype(np.uint32)),
    "narrower words": ("fp32", lambda good: good.view(np.uint16)[..., ::2].copy()),
    "wrong shape": ("fp16", lambda good: good[:, :8]),
    "strided": ("fp16", lambda good: np.repeat(good, 2, axis=-1)[..., ::2]),
    "fortran order": ("fp32", np.asfortranarray),
    "read-only": ("bf16", _read_only),
    "not an array": ("fp16", lambda good: [[0]]),
}


def refused(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except Exception as error:
        return error
    raise AssertionError("expected the tensor to be refused")


@pytest.mark.parametrize("case", sorted(BAD))
def test_both_bindings_refuse_a_bad_tensor_alike(modules: tuple[Any, Any], case: str) -> None:
    dtype, make_bad = BAD[case]
    engine, worker = bindings(modules, dtype)
    good = np.zeros(SHAPE, WORDS[dtype])
    bad = make_bad(good)
    by_engine = refused(lambda: engine.register_kv_caches([good, bad]))
    by_connector = refused(lambda: worker.register_kv_caches({LAYERS[0]: good, LAYERS[1]: bad}))
    assert type(by_engine) is type(by_connector) is modules[0].EngineInputError
    assert isinstance(by_connector, ValueError)
    engine_says = str(by_engine).removeprefix("layers[1]: ")
    assert engine_says != str(by_engine), str(by_engine)
    assert str(by_connector) == f'kv_caches["{LAYERS[1]}"]: {engine_says}'
    assert "expected" in engine_says and "; got " in engine_says, engine_says


@pytest.mark.parametrize(
    ("dtype", "element"),
    [
        ("fp16", np.uint16),
        ("fp16", np.float16),
        ("bf16", np.uint16),
        ("fp32", np.uint32),
        ("fp32", np.float32),
    ],
)
def test_both_bindings_take_raw_words_or_the_layouts_own_dtype(
    modules: tuple[Any, Any], dtype: str, element: type
) -> None:
    """Raw words (what numpy callers hold) or the layout's own dtype (what vLLM's torch KV caches
    are: float16, bfloat16, float32), in the engine, the connector and the Python reference."""
    engine, worker = bindings(modules, dtype)
    engine.register_kv_caches([np.zeros(SHAPE, element) for _ in LAYERS])
    worker.register_kv_caches({name: np.zeros(SHAPE, element) for name in LAYERS})
    layout = SimpleNamespace(
        num_layers=len(LAYERS), block_size=BLOCK, num_kv_heads=HEADS, head_dim=HEAD_DIM, dtype=dtype
    )
    slot = reference.stored_block_bytes(layout, "exact")
    ours = reference.Engine(layout, "exact", 4 * slot, 2, 8, BLOCKS)
    ours.register_kv_caches([np.zeros(SHAPE, element) for _ in LAYERS])
