"""The built engine (activekv._engine.Engine) against the Python reference: the same scripted steps
(exact mode, and a few in the compressed modes) compared event by event and byte by byte, the same
errors for bad input and hooks out of order (each leaving the engine usable), and the registered KV
arrays kept alive.

The module comes from the wheel under test (tests/conftest.py: `engine_module`).
"""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_engine_reference import (
    SCENARIOS,
    Driver,
    bad_inputs,
    check_usable,
    out_of_order_calls,
    raised,
)

from reference import engine as reference

REPO = Path(__file__).resolve().parent.parent


def _run_step(engine: Any, layers: int) -> None:
    """build_step, then the step's hooks over `layers` layers."""
    engine.build_step()
    engine.start_load()
    for layer in range(layers):
        engine.wait_for_layer_load(layer)
        engine.save_kv_layer(layer)
    engine.wait_for_save()


@pytest.fixture(scope="session")
def native(engine_module: Any) -> Any:
    """activekv._engine from the wheel under test (tests/conftest.py builds and installs it)."""
    return engine_module


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_matches_the_reference(native, name):
    expected = SCENARIOS[name](reference).records
    actual = SCENARIOS[name](native).records
    assert len(actual) == len(expected)
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert got[0] == want[0], f"record {index}"
        # Events and lookups first, so a difference reads as the first event that departs.
        if got[0] == "step":
            assert got[2] == want[2], f"record {index}: events"
            assert got[1] == want[1], f"record {index}: lost device blocks per layer"
            assert got[3] == want[3], f"record {index}: device KV bytes"
        else:
            assert got == want, f"record {index}"


def test_stored_block_bytes_match(native):
    for dtype in ("fp16", "bf16", "fp32"):
        ours = native.KvBlockLayout(3, 16, 2, 64, getattr(native.KvDtype, dtype))
        theirs = SimpleNamespace(
            num_layers=3, block_size=16, num_kv_heads=2, head_dim=64, dtype=dtype
        )
        assert native.stored_block_bytes(ours, "exact") == reference.stored_block_bytes(
            theirs, "exact"
        )
        engine = native.Engine(ours, "exact", 10 * native.stored_block_bytes(ours, "exact") + 5,
                               2, 2, 4)  # fmt: skip
        assert engine.slot_bytes == native.stored_block_bytes(ours, "exact")
        assert engine.num_slots == 10
        assert (engine.fatal, engine.quarantined_regions) == (False, 0)


def _bad_input_indices() -> range:
    return range(len(bad_inputs(Driver(reference))))


@pytest.mark.parametrize("index", _bad_input_indices())
def test_bad_input_matches_the_reference_and_leaves_the_engine_usable(native, index):
    ours, theirs = Driver(native), Driver(reference)
    name, call, text = bad_inputs(ours)[index]
    error, message = raised(call)
    assert (error, message) == raised(bad_inputs(theirs)[index][1]), name
    assert error is ValueError and text in message, name
    assert check_usable(ours) == check_usable(theirs), name


@pytest.mark.parametrize("index", range(len(out_of_order_calls(Driver(reference)))))
def test_hooks_out_of_order_match_the_reference(native, index):
    ours, theirs = Driver(native), Driver(reference)
    name, call, _ = out_of_order_calls(ours)[index]
    error, message = raised(call)
    assert (error, message) == raised(out_of_order_calls(theirs)[index][1]), name
    assert error is RuntimeError, name
    assert check_usable(ours) == check_usable(theirs), name


def _mid_step_calls(driver: Driver) -> list[Any]:
    """Every hook that is not the next one, at every point of a step, then the step's own call;
    what each did, then the step's events and the device KV."""
    engine = driver.engine
    layers = range(driver.num_layers)
    hooks: dict[Any, Any] = {
        "build_step": engine.build_step,
        "start_load": engine.start_load,
        "plan_load": lambda: engine.plan_load([1], [2]),
        "plan_store": lambda: engine.plan_store([1], [2]),
        "plan_step": lambda: engine.plan_step([1], [2], [3], [4]),
        "register_kv_caches": lambda: engine.register_kv_caches(driver.kv),
        "wait_for_save": engine.wait_for_save,
    }
    for layer in layers:
        hooks["wait", layer] = lambda layer=layer: engine.wait_for_layer_load(layer)
        hooks["save", layer] = lambda layer=layer: engine.save_kv_layer(layer)
    order = ["build_step", "start_load"]
    for layer in layers:
        order += [("wait", layer), ("save", layer)]
    order.append("wait_for_save")

    outcomes: list[Any] = []
    engine.plan_load([501, 7], [3, 4])
    engine.plan_store([9], [5])
    for position, key in enumerate(order):
        for other, call in hooks.items():
            planning_call = other in ("plan_load", "plan_store", "plan_step", "register_kv_caches")
            # register_kv_caches is allowed until the step runs (SPEC §6 rule 8).
            registering_before_run = other == "register_kv_caches" and position <= 1
            if other == key or (position == 0 and planning_call) or registering_before_run:
                continue
            error, message = raised(call)
            outcomes.append((position, other, error.__name__, message))
        outcomes.append((position, key, "ok", hooks[key]()))
    outcomes.append(driver.events())
    outcomes.append(driver.kv_bytes())
    return outcomes


def test_hooks_out_of_order_at_every_point_of_a_step(native):
    ours, theirs = Driver(native), Driver(reference)
    for driver in (ours, theirs):
        driver.fill(5)
        driver.step(stores=[(501, 0)])
        driver.events()
    got = _mid_step_calls(ours)
    assert got == _mid_step_calls(theirs)
    assert all(outcome[2] == "RuntimeError" for outcome in got[:-2] if outcome[2] != "ok")
    assert got[-2] == [("hit", 501), ("miss", 7), ("loaded", 501), ("commit", 9)]


@pytest.mark.parametrize(
    "arguments",
    [
        ("zip", 100, 1, 1, 1),
        ("exact", -1, 1, 1, 1),
        ("exact", 7, 1, 1, 1),
        ("exact", 8, 0, 1, 1),
        ("exact", 8, 1, 0, 1),
        ("exact", 8, 1, 1, 0),
        ("exact", 8, -1, 1, 1),
        # Beyond int64, and a pool larger than the machine: refused naming the argument, before
        # anything is allocated (not a TypeError, not a MemoryError).
        ("exact", 2**70, 1, 1, 1),
        ("exact", 8, 1, 1, -(2**64)),
        ("exact", 2**40 * 1024, 1, 1, 1),
        # More regions than any pool: EngineInputError before the pool is allocated or sized.
        ("exact", 8, 2**20 + 1, 1, 1),
        ("exact", 2**40 * 1024, 2**20 + 1, 1, 1),
    ],
)
def test_construction_errors_match_the_reference(native, arguments):
    ours = native.KvBlockLayout(1, 1, 1, 1, native.KvDtype.fp32)
    theirs = SimpleNamespace(num_layers=1, block_size=1, num_kv_heads=1, head_dim=1, dtype="fp32")
    error, message = raised(lambda: native.Engine(ours, *arguments))
    assert error is ValueError
    with pytest.raises((native.EngineInputError, native.LayoutError)):  # LayoutError: the mode
        native.Engine(ours, *arguments)
    assert (error, message) == raised(lambda: reference.Engine(theirs, *arguments))


@pytest.mark.parametrize(
    ("dimensions", "text"),
    [
        ((-1, 16, 2, 8), "num_layers: expected a positive integer below 2\\*\\*32; got -1"),
        (
            (1, 2**32, 2, 8),
            "block_size: expected a positive integer below 2\\*\\*32; got 4294967296",
        ),
        ((1, 16, 2**70, 8), "num_kv_heads: expected a positive integer below 2\\*\\*32; got 1180"),
        ((1, 16, 2, 0), "head_dim: expected a positive value; got 0"),
    ],
)
def test_a_layout_dimension_out_of_range_is_a_value_error_naming_it(native, dimensions, text):
    with pytest.raises(native.LayoutError, match=text) as caught:
        native.KvBlockLayout(*dimensions, native.KvDtype.bf16)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("layer", [-1, 3, 2**40, 2**70])
def test_offset_of_a_layer_out_of_range_is_a_layout_error_naming_it(native, layer):
    layout = native.KvBlockLayout(3, 16, 2, 8, native.KvDtype.bf16)
    with pytest.raises(native.LayoutError, match=rf"^layer: expected 0 <= layer < 3; got {layer}$"):
        layout.offset_of(layer, False)
    last_value = 2 * layout.bytes_per_layer + layout.bytes_per_tensor
    assert layout.offset_of(np.int64(2), True) == last_value


@pytest.mark.parametrize("stream", [-1, 2**64, 2**100])
def test_a_stream_out_of_range_is_a_value_error_naming_it(native, stream):
    driver = Driver(native)
    with pytest.raises(native.EngineInputError, match=rf"stream: expected a cudaStream_t handle, "
                       rf"an integer 0 <= stream < 2\*\*64; got {stream}$"):  # fmt: skip
        driver.engine.save_kv_layer(0, stream=stream)
    driver.step(stores=[(1, 0)])  # the engine is unchanged and usable


def test_an_argument_that_is_not_an_integer_stays_a_type_error(native):
    layout = native.KvBlockLayout(1, 1, 1, 1, native.KvDtype.fp32)
    with pytest.raises(TypeError):
        native.KvBlockLayout(1, 16, 2, 8.0, native.KvDtype.bf16)
    with pytest.raises(TypeError):
        native.Engine(layout, "exact", "8", 1, 1, 1)
    with pytest.raises(TypeError):
        Driver(native).engine.save_kv_layer(0, stream="0")
    # Anything with __index__ is an integer, as operator.index has it.
    assert native.KvBlockLayout(np.int64(1), 16, 2, 8, native.KvDtype.bf16).num_layers == 1


def test_not_iterable_is_a_type_error_in_both(native):
    for module in (native, reference):
        driver = Driver(module)
        with pytest.raises(TypeError):
            driver.engine.lookup(5)
        with pytest.raises(TypeError):
            driver.engine.inject_fence_fault(1, 0)


def test_registered_arrays_are_kept_alive_and_never_copied(native):
    driver = Driver(native)
    layers = [np.zeros_like(layer) for layer in driver.kv]
    watchers = [weakref.ref(layer) for layer in layers]
    first = layers[0]
    driver.engine.register_kv_caches(layers)
    del layers
    gc.collect()
    assert all(watcher() is not None for watcher in watchers)  # the engine holds them

    # Written in place: a store from the registered arrays and a load back into them.
    first[:, 0] = 0x1234
    driver.step(stores=[(1, 0)])
    driver.step(loads=[(1, 6)])
    assert (first[:, 6] == 0x1234).all()
    del first

    # Registering other arrays lets the old ones go.
    driver.engine.register_kv_caches(driver.kv)
    gc.collect()
    assert all(watcher() is None for watcher in watchers)


def test_lookups_from_another_thread_during_steps(native):
    driver = Driver(native, slots=6)
    driver.step(stores=[(1, 0), (2, 1)])
    stop = threading.Event()
    seen: list[int] = []

    def look() -> None:
        while not stop.is_set():
            seen.append(driver.engine.lookup([1, 2]))

    thread = threading.Thread(target=look)
    thread.start()
    try:
        for step in range(50):
            driver.fill(step)
            driver.step(loads=[(1, 2), (2, 3)], stores=[(100 + step, 4), (200 + step, 5)])
    finally:
        stop.set()
        thread.join()
    assert seen and set(seen) == {2}
    assert driver.engine.lookup([1, 2, 149, 249]) == 4


def _layout_and_gpu(native: Any) -> tuple[Any, str | None]:
    from release.gpu import detect_gpu

    return native.KvBlockLayout(2, 16, 2, 8, native.KvDtype.bf16), detect_gpu()


def test_device_kv_cache_refuses_bad_arguments_and_names_the_cuda_call(native):
    layout, gpu = _layout_and_gpu(native)
    with pytest.raises(native.EngineInputError, match="num_device_blocks: expected a non-neg"):
        native.DeviceKvCache(layout, -1)
    if gpu is not None:
        pytest.skip(f"this machine has a GPU ({gpu}): the round trip test below runs instead")
    with pytest.raises(native.CudaRouteError, match="cudaGetDevice"):
        native.DeviceKvCache(layout, 4)


def test_device_kv_cache_round_trip_through_the_engine(native):
    """On a GPU: the wheel's own device KV takes bytes, gives them back, and the engine's CUDA
    route stores and loads through it (what the GPU gates use instead of torch)."""
    layout, gpu = _layout_and_gpu(native)
    if gpu is None:
        pytest.skip("no GPU runner")
    cache = native.DeviceKvCache(layout, 4)
    assert (cache.num_layers, cache.layer_bytes) == (2, 4 * layout.bytes_per_layer)
    assert cache.download(0) == bytes(cache.layer_bytes)  # zeroed at construction
    words = np.random.default_rng(3).integers(0, 2**16, (2, 4, 16, 2, 8), dtype=np.uint16)
    for layer in range(2):
        cache.upload(layer, words + layer)
    with pytest.raises(native.EngineInputError, match="layer: expected 0 <= layer < 2"):
        cache.download(2)
    with pytest.raises(ValueError, match=r"expected .* bytes"):
        cache.upload(0, b"short")
    slot = native.stored_block_bytes(layout, "exact")
    engine = native.Engine(layout, "exact", 8 * slot, 2, 4, 4, device="cuda")
    engine.register_kv_caches(cache.layers)

    def step() -> None:
        _run_step(engine, 2)

    engine.plan_store([11, 12], [0, 1])  # blocks 0 and 1 of every layer go to the host pool
    step()
    engine.events()
    engine.plan_load([11, 12], [2, 3])  # and come back into blocks 2 and 3
    step()
    for layer in range(2):
        back = np.frombuffer(cache.download(layer), np.uint16).reshape(words.shape)
        np.testing.assert_array_equal(back[:, 2:4], (words + layer)[:, 0:2])


def test_event_arrays_are_the_events_as_arrays(native):
    # Two engines driven alike: one read by events(), the other by event_arrays(). Stores that
    # overflow the pool evict, and loads hit and miss, so most kinds appear.
    layout = native.KvBlockLayout(2, 4, 1, 8, native.KvDtype.fp16)
    slot = native.stored_block_bytes(layout, "exact")
    engines = [native.Engine(layout, "exact", 4 * slot, 2, 4, 8) for _ in range(2)]
    caches = [[np.zeros((2, 8, 4, 1, 8), np.uint16) for _ in range(2)] for _ in engines]
    read: list[list[tuple[str, int]]] = [[], []]
    for engine, cache in zip(engines, caches, strict=True):
        engine.register_kv_caches(cache)
    for step in range(3):
        for index, engine in enumerate(engines):
            engine.lookup([2**63 + 1, 5])
            engine.plan_load([2**63 + 1, 5, 99], [4, 5, 6])
            engine.plan_store([2**63 + step, 10 + step, 20 + step], [0, 1, 2])
            _run_step(engine, 2)
            if index == 0:
                read[0] += engine.events()
                continue
            kinds, values = engine.event_arrays()
            assert (kinds.dtype, values.dtype, kinds.shape) == (np.uint8, np.uint64, values.shape)
            read[1] += [(native.EVENT_KINDS[k], int(v)) for k, v in zip(kinds, values, strict=True)]
    assert read[1] == read[0]
    assert {kind for kind, _ in read[0]} >= {"lookup", "hit", "miss", "evict", "commit"}
    assert 2**63 + 1 in {value for _, value in read[0]}  # values keep all 64 bits
    kinds, values = engines[1].event_arrays()  # the log was emptied
    assert (kinds.size, values.size) == (0, 0)
