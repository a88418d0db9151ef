"""The device KV as vLLM 0.33.0 hands it to register_kv_caches: per-layer [B, H, N, 2 * D] views
over one allocation, placed by each KVCacheLayout (tests/fixtures_kv.py). The built engine and
the reference read every layout by its strides, never by assuming one (SPEC.md §1): each round
trip gives back every byte (exact) or what the dense form gives (int8, fp8), and the two
implementations agree on every event and byte."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from fixtures_kv import KV_CACHE_LAYOUTS, byte_strides
from test_engine_reference import Driver, raised, scenario_random

from reference import engine as reference

MODES = ("exact", "int8", "fp8_e4m3")


@pytest.fixture(scope="module")
def native(activekv_site: Any) -> Any:
    import activekv._engine as engine

    return engine


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
def test_every_layout_matches_the_reference(native: Any, layout: str, mode: str) -> None:
    for dtype in ("fp16", "bf16", "fp32"):
        expected = scenario_random(reference, 21, dtype, mode, kv_layout=layout).records
        assert scenario_random(native, 21, dtype, mode, kv_layout=layout).records == expected


def _logical(driver: Driver) -> list[np.ndarray]:
    """Every layer's K and V as [2, B, T, H, D] words, whatever the form."""
    if driver.kv[0].ndim == 5:
        return [np.array(layer) for layer in driver.kv]
    head_dim = driver.kv[0].shape[-1] // 2
    return [np.stack([layer[..., :head_dim], layer[..., head_dim:]]).transpose(0, 1, 3, 2, 4)
            for layer in driver.kv]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
@pytest.mark.parametrize("module_name", ["native", "reference"])
def test_a_block_stored_from_a_layout_loads_back_as_the_dense_form_does(
    native: Any, module_name: str, layout: str, mode: str
) -> None:
    module = native if module_name == "native" else reference
    shape = {"num_layers": 2, "dtype": "bf16", "block_size": 4, "num_kv_heads": 3,
             "head_dim": 8, "mode": mode}  # fmt: skip
    drivers = [Driver(module, **shape), Driver(module, **shape, kv_layout=layout)]
    rng = np.random.Generator(np.random.PCG64(5))
    words = rng.integers(0, 2**16, (2, 2, 8, 4, 3, 8), dtype=np.uint16)  # layer, K/V, B, T, H, D
    for driver in drivers:
        for layer, kv in enumerate(driver.kv):
            if kv.ndim == 5:
                kv[...] = words[layer]
            else:
                kv[..., :8] = words[layer, 0].transpose(0, 2, 1, 3)
                kv[..., 8:] = words[layer, 1].transpose(0, 2, 1, 3)
        assert [x.tobytes() for x in _logical(driver)] == [w.tobytes() for w in words]
        driver.step(stores=[(11, 1), (12, 6)])
        for kv in driver.kv:
            kv[...] = 0  # the device KV is lost
        driver.step(loads=[(11, 3), (12, 0)])
    dense, placed = (_logical(driver) for driver in drivers)
    for layer in range(2):
        assert placed[layer].tobytes() == dense[layer].tobytes()
        if mode == "exact":
            assert (placed[layer][:, 3] == words[layer][:, 1]).all()
            assert (placed[layer][:, 0] == words[layer][:, 6]).all()
    assert not placed[0][:, [1, 2, 4, 5, 6, 7]].any()  # nothing else was written


def _bad_views(module: Any) -> list[tuple[str, Any]]:
    driver = Driver(module, num_device_blocks=8, kv_layout="LBNHC")
    good = driver.kv
    bytes_view = [np.ascontiguousarray(layer).view(np.uint8) for layer in good]
    transposed = np.zeros((8, 2, 1, 8), np.uint16).transpose(0, 2, 1, 3)  # [B, H, N, 2D]
    last_strided = np.zeros((8, 1, 2, 16), np.uint16)[..., ::2]
    split = np.zeros((16, 1, 1, 8), np.uint16)  # kernel blocks of 1 token
    odd = np.zeros(8 * 2 * 8 * 2 + 1, np.uint8)[1:].view(np.uint16).reshape(8, 1, 2, 8)

    def register(index: int, array: Any) -> Any:
        return lambda: driver.engine.register_kv_caches([*good[:index], array, *good[index + 1 :]])

    return [
        ("bytes are taken", register(0, bytes_view[0])),
        ("int16 words", register(1, good[1].view(np.int16))),
        ("wrong heads", register(2, np.zeros((8, 2, 2, 8), np.uint16))),
        ("kernel split", register(0, split)),
        ("last stride", register(1, last_strided)),
        ("misaligned", register(2, odd)),
        ("strided but whole", register(0, transposed)),
    ]


def _outcome(call: Any) -> tuple[Any, str]:
    try:
        call()
    except (ValueError, TypeError):
        return raised(call)
    return None, "taken"


@pytest.mark.parametrize("index", range(7))
def test_a_view_is_taken_or_refused_as_the_reference_does(native: Any, index: int) -> None:
    name, call = _bad_views(native)[index]
    got = _outcome(call)
    assert got == _outcome(_bad_views(reference)[index][1]), name
    assert (got[0] is None) == (name in ("bytes are taken", "strided but whole")), got


@pytest.mark.parametrize("layout", [None, "LBNHC"])
def test_dlpack_capsules_are_taken_in_either_form(native: Any, layout: str | None) -> None:
    """A capsule can be consumed once: each layer is cast exactly once (DeviceKvCache.layers are
    capsules)."""
    driver = Driver(native, kv_layout=layout)
    driver.kv[0][...] = 7
    driver.engine.register_kv_caches([layer.__dlpack__() for layer in driver.kv])
    driver.step(stores=[(5, 1)])
    driver.step(loads=[(5, 2)])
    assert (_logical(driver)[0][:, 2] == 7).all()  # block 2 came back


def _cuda_layer_views(torch: Any, layout: str, shape: tuple[int, ...], dtype: Any) -> list[Any]:
    """As vLLM's allocate_kv_cache on a GPU: one int8 allocation, [B, H, N, 2D] views of
    `dtype` per layer placed by `layout` (shape is the logical [L, B, H, N, C bytes])."""
    backing = torch.zeros(math.prod(shape), dtype=torch.int8, device="cuda")
    logical = torch.as_strided(backing, shape, byte_strides(layout, shape))
    return [logical[layer].view(dtype) for layer in range(shape[0])]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", sorted(KV_CACHE_LAYOUTS))
def test_the_cuda_route_serves_every_layout_as_the_cpu_route_does(
    native: Any, layout: str, mode: str
) -> None:
    """On a GPU with torch: torch KV caches laid out as vLLM lays them out, stored and loaded by
    the CUDA route; every byte equal to what the CPU route (the same engine, host views) left."""
    from release.gpu import detect_gpu

    if detect_gpu() is None:
        pytest.skip("not run: no GPU runner")
    torch = pytest.importorskip("torch")
    layers, blocks, heads, tokens, head_dim = 2, 8, 3, 16, 64
    layout_ = native.KvBlockLayout(layers, tokens, heads, head_dim, native.KvDtype.bf16)
    slot = native.stored_block_bytes(layout_, mode)
    rng = np.random.Generator(np.random.PCG64(11))
    words = rng.integers(0, 2**16, (layers, blocks, heads, tokens, 2 * head_dim), dtype=np.uint16)
    words[..., :] &= 0x7F7F  # finite bf16 values: the codecs' scales stay defined
    host = Driver(native, num_layers=layers, dtype="bf16", block_size=tokens,
                  num_kv_heads=heads, head_dim=head_dim, slots=8, num_device_blocks=blocks,
                  mode=mode, kv_layout=layout)  # fmt: skip
    shape = (layers, blocks, heads, tokens, 2 * head_dim * 2)
    device = _cuda_layer_views(torch, layout, shape, torch.bfloat16)
    for layer in range(layers):
        host.kv[layer][...] = words[layer]
        device[layer].copy_(torch.from_numpy(words[layer].view(np.int16)).view(torch.bfloat16))
    engine = native.Engine(layout_, mode, 8 * slot, 4, 4, blocks, device="cuda")
    engine.register_kv_caches(device)
    torch.cuda.synchronize()

    def step(driven: Any, loads: list[tuple[int, int]], stores: list[tuple[int, int]]) -> None:
        if loads:
            driven.plan_load([h for h, _ in loads], [d for _, d in loads])
        if stores:
            driven.plan_store([h for h, _ in stores], [d for _, d in stores])
        driven.build_step()
        driven.start_load()
        for layer in range(layers):
            assert list(driven.wait_for_layer_load(layer)) == []
            driven.save_kv_layer(layer)
        driven.wait_for_save()

    for driven, clear in ((host.engine, lambda: [kv.fill(0) for kv in host.kv]),
                          (engine, lambda: [kv.zero_() for kv in device])):  # fmt: skip
        step(driven, [], [(11, 1), (12, 6)])
        torch.cuda.synchronize()
        clear()
        torch.cuda.synchronize()
        step(driven, [(11, 3), (12, 0)], [])
    torch.cuda.synchronize()
    for layer in range(layers):
        got = device[layer].view(torch.int16).cpu().numpy().view(np.uint16)
        want = np.array(host.kv[layer])
        assert got.tobytes() == want.tobytes(), (layout, mode, layer)
        if mode == "exact":
            assert (got[3] == words[layer][1]).all() and (got[0] == words[layer][6]).all()
