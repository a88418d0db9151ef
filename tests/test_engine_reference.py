"""The Python reference of the engine (reference/engine.py) against engine/offload/SPEC.md:
LRU with pins and refusal, quarantine and fatal, the staging leases, events in order, hooks out of
order and bad input.

The drivers and scenarios here are shared with tests/test_engine_binding.py, which runs them
through the built engine and compares every event and every byte with the reference.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fixtures_kv import layer_views

from reference import engine as reference

WORDS = {"fp16": np.uint16, "bf16": np.uint16, "fp32": np.uint32}


class Driver:
    """One engine (reference or built) with its device KV, driven the way vLLM drives it."""

    def __init__(
        self,
        module: Any,
        *,
        num_layers: int = 3,
        dtype: str = "fp16",
        block_size: int = 2,
        num_kv_heads: int = 1,
        head_dim: int = 4,
        slots: int = 4,
        num_regions: int = 4,
        region_blocks: int = 4,
        num_device_blocks: int = 8,
        mode: str = "exact",
        kv_layout: str | None = None,
    ) -> None:
        geometry = (num_layers, block_size, num_kv_heads, head_dim)
        if hasattr(module, "KvBlockLayout"):
            self.layout = module.KvBlockLayout(*geometry, getattr(module.KvDtype, dtype))
        else:
            self.layout = SimpleNamespace(
                num_layers=num_layers,
                block_size=block_size,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                dtype=dtype,
            )
        self.module = module
        self.num_layers = num_layers
        slot_bytes = module.stored_block_bytes(self.layout, mode)
        self.engine = module.Engine(
            self.layout, mode, slots * slot_bytes, num_regions, region_blocks, num_device_blocks
        )
        if kv_layout is None:  # the dense [2, B, T, H, D] form
            shape = (2, num_device_blocks, block_size, num_kv_heads, head_dim)
            self.kv = [np.zeros(shape, dtype=WORDS[dtype]) for _ in range(num_layers)]
        else:  # vLLM's per-layer views [B, H, T, 2 * D] under a KVCacheLayout
            self.kv = layer_views(kv_layout, num_layers, num_device_blocks, num_kv_heads,
                                  block_size, head_dim, WORDS[dtype])  # fmt: skip
        self.engine.register_kv_caches(self.kv)

    def fill(self, seed: int) -> None:
        """Random raw words (non-finite and subnormal values included) in every layer."""
        rng = np.random.Generator(np.random.PCG64(seed))
        for layer in self.kv:
            bits = layer.dtype.itemsize * 8
            layer[...] = rng.integers(0, 2**bits, layer.shape, dtype=layer.dtype)

    def step(
        self,
        loads: Iterable[tuple[int, int]] = (),
        stores: Iterable[tuple[int, int]] = (),
        faults: Iterable[tuple[str, int]] = (),
    ) -> list[list[int]]:
        """One whole step; the device blocks reported lost at each layer."""
        loads, stores = list(loads), list(stores)
        if loads:
            self.engine.plan_load([h for h, _ in loads], [d for _, d in loads])
        if stores:
            self.engine.plan_store([h for h, _ in stores], [d for _, d in stores])
        self.engine.build_step()
        for direction, layer in faults:
            self.engine.inject_fence_fault(direction, layer)
        self.engine.start_load()
        lost = []
        for layer in range(self.num_layers):
            lost.append(list(self.engine.wait_for_layer_load(layer)))
            self.engine.save_kv_layer(layer)
        self.engine.wait_for_save()
        return lost

    def events(self) -> list[tuple[str, int]]:
        return [tuple(event) for event in self.engine.events()]

    def kv_bytes(self) -> bytes:
        return b"".join(layer.tobytes() for layer in self.kv)

    def state(self) -> tuple[int, int, bool, int, dict[str, int]]:
        return (
            self.engine.slot_bytes,
            self.engine.num_slots,
            self.engine.fatal,
            self.engine.quarantined_regions,
            dict(self.engine.extent_stats),
        )


class Transcript:
    """Everything a scenario observed, in order: compared whole between implementations."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.records: list[Any] = []

    def step(self, seed: int | None = None, **plan: Any) -> list[list[int]]:
        if seed is not None:
            self.driver.fill(seed)
        lost = self.driver.step(**plan)
        self.records.append(("step", lost, self.driver.events(), self.driver.kv_bytes()))
        self.records.append(("state", self.driver.state()))
        return lost

    def lookup(self, hashes: list[int]) -> int:
        found = self.driver.engine.lookup(hashes)
        self.records.append(("lookup", found, self.driver.events()))
        return found


# ---- scenarios: each drives one engine of `module` and returns its transcript ----


def scenario_round_trip(module: Any) -> Transcript:
    t = Transcript(Driver(module, slots=8))
    t.step(seed=1, stores=[(11, 0), (12, 5), (13, 7)])
    t.lookup([11, 12, 13, 14])
    t.step(seed=2, loads=[(12, 3), (11, 6), (99, 1)])
    t.step(seed=3, loads=[(13, 0), (13, 1)])  # one block loaded twice: two pins
    return t


def scenario_lru_pins_refusal(module: Any) -> Transcript:
    t = Transcript(Driver(module, slots=2))
    t.step(seed=1, stores=[(1, 0)])
    t.step(seed=2, stores=[(2, 1)])
    t.step(seed=3, loads=[(1, 2)])  # block 1 is now the more recent
    t.step(seed=4, stores=[(3, 3)])  # evicts 2
    t.step(seed=5, loads=[(1, 4), (3, 5)], stores=[(4, 6)])  # both pinned: refused
    t.step(seed=6, loads=[(3, 4)], stores=[(4, 6), (5, 7)])  # evicts 1, then refuses 5
    t.lookup([3, 4])
    return t


def scenario_duplicates(module: Any) -> Transcript:
    t = Transcript(Driver(module))
    t.step(seed=1, stores=[(1, 0)])
    t.step(seed=2, stores=[(1, 1), (2, 2), (2, 3)])
    t.lookup([1, 2])
    return t


def scenario_faults(module: Any) -> Transcript:
    t = Transcript(Driver(module, slots=6, num_regions=5))
    t.step(seed=1, stores=[(1, 0), (2, 1)])
    t.step(seed=2, loads=[(1, 4), (2, 5)], faults=[("load", 1)])
    t.step(seed=3, loads=[(1, 4)], stores=[(3, 2)], faults=[("store", 0), ("store", 2)])
    t.step(seed=4, stores=[(3, 2)], faults=[("load", 0)])  # no load: the fault waits
    t.step(seed=5, loads=[(2, 6)], stores=[(4, 3)])
    t.lookup([1, 2, 3, 4])
    return t


def scenario_all_quarantined(module: Any) -> Transcript:
    t = Transcript(Driver(module, num_regions=2))
    t.step(seed=1, stores=[(1, 0)])
    t.step(seed=2, loads=[(1, 3)], stores=[(2, 1)], faults=[("load", 0), ("store", 1)])
    t.step(seed=3, loads=[(1, 3)], stores=[(2, 1)], faults=[("load", 2)])
    for seed in (4, 5):
        t.step(seed=seed, loads=[(1, 3)], stores=[(5, 4)])
    t.lookup([1, 2, 5])
    return t


def scenario_one_region(module: Any) -> Transcript:
    t = Transcript(Driver(module, num_regions=1))
    t.step(seed=1, stores=[(1, 0), (2, 1)])
    t.step(seed=2, loads=[(1, 6)])
    t.step(seed=3, loads=[(2, 5)], stores=[(3, 0)])
    t.lookup([1, 2, 3])
    return t


def scenario_no_forward(module: Any) -> Transcript:
    t = Transcript(Driver(module))
    driver = t.driver
    driver.engine.plan_load([42], [0])
    driver.engine.build_step()
    driver.engine.start_load()
    driver.engine.wait_for_save()  # nothing to move: the layer hooks may be skipped
    t.records.append(("no_forward", driver.events()))
    t.step(seed=1, stores=[(1, 0)])
    return t


def scenario_extents(module: Any) -> Transcript:
    """A step's stores in one extent, a prefix loaded back as one run, evictions that coalesce
    before placement, a failed store's holes and a step split over them (SPEC.md §2)."""
    t = Transcript(Driver(module, slots=10, num_regions=6, region_blocks=8,
                          num_device_blocks=16))  # fmt: skip
    t.step(seed=1, stores=[(1, 0), (2, 1), (3, 2), (4, 3)])  # slots 0..3: one extent
    t.step(seed=2, stores=[(5, 4), (6, 9), (7, 5)])  # slots 4..6
    # A run of 3 loaded (into consecutive device blocks); the pool is full after it.
    t.step(seed=3, loads=[(1, 8), (2, 9), (3, 10)], stores=[(8, 0), (9, 1), (14, 2)])
    # The extent of 5, 6, 7 is the least recently used, then that of 1..4, whose block 1 is
    # pinned by a load and stays: slots 1..6 coalesce, and the step takes four of them.
    t.step(seed=4, loads=[(1, 12)], stores=[(10, 2), (11, 3), (12, 4), (13, 5)])
    # Block 9 pinned by a load, its extent's others (8, 14) evicted: slots 5..7 and 9 free, so
    # four stores are split; the store fails and leaves them free, and the next step's stores
    # are split over them again.
    t.step(seed=5, loads=[(9, 10)], stores=[(20, 6), (21, 7), (22, 0), (26, 1)],
           faults=[("store", 1)])  # fmt: skip
    t.step(seed=6, stores=[(23, 1), (24, 2), (25, 3), (27, 4)])
    t.step(seed=7, loads=[(10, 6), (11, 7), (12, 8), (13, 9)])
    t.lookup([10, 11, 12, 13, 23])
    return t


def scenario_load_targets(module: Any) -> Transcript:
    """A device block loaded twice by one hash in a step, stores that read one device block, and
    loads of another hash into a block the step loads already, refused whether the first is in
    an earlier call or earlier in the same one, planning nothing of the call (SPEC.md §6)."""
    t = Transcript(Driver(module, slots=8))
    t.step(seed=1, stores=[(1, 0), (2, 0), (3, 1)])  # 1 and 2 hold the same bytes
    t.step(seed=2, loads=[(1, 4), (1, 4)])  # the same bytes twice into block 4
    engine = t.driver.engine
    engine.plan_load([2], [5])
    t.records.append(("refused", raised(lambda: engine.plan_load([3, 1], [6, 5]))))
    t.records.append(("refused", raised(lambda: engine.plan_load([3, 2, 1], [6, 7, 6]))))
    t.step(seed=3, loads=[(3, 6)])  # with the 2 planned before: the refused calls left nothing
    return t


def scenario_plan_step(module: Any) -> Transcript:
    """plan_load and plan_store in one call: a call refused for its stores (or a limit) plans
    none of its loads, so the step built next neither hits nor overwrites their device blocks
    (SPEC.md §6 rule 11); an accepted call plans both."""
    t = Transcript(Driver(module, slots=4, region_blocks=2))
    t.step(seed=1, stores=[(1, 5), (2, 6)])
    engine = t.driver.engine
    for call in (
        lambda: engine.plan_step([1], [5], [9], [8]),  # a store's device block out of range
        lambda: engine.plan_step([1, 2], [5, 6], [7, 8, 9], [0, 1, 2]),  # too many stores
        lambda: engine.plan_step([1, 2], [5, 5], [], []),  # two hashes into one device block
        lambda: engine.plan_step([1], [5], [9, 10], [0]),  # store lists of two lengths
        lambda: engine.plan_step([1], [5], ["x"], [0]),  # a store hash that is no integer
    ):
        t.records.append(("refused", raised(call)))
    t.step(seed=2)  # the refused calls planned nothing: no hit, device blocks 5, 6 as filled
    engine.plan_step([1], [3], [9], [0])
    engine.plan_load([2], [7])
    t.records.append(("refused", raised(lambda: engine.plan_step([], [], [10, 11], [1, 2]))))
    t.step(seed=3)  # the accepted plans, run by the step built next
    t.lookup([9, 10])
    return t


def scenario_huge_region_blocks(module: Any) -> Transcript:
    """Any region_blocks below 2**63 serves (SPEC.md §6 rule 10): a step's reservation is bounded
    by the pool, not by region_blocks."""
    t = Transcript(Driver(module, slots=2, region_blocks=2**62))
    t.step(seed=1, stores=[(1, 0), (2, 1)])
    t.step(seed=2, stores=[(3, 2), (4, 3), (5, 4)])  # evicts 1 and 2, refuses 5
    t.step(seed=3, loads=[(3, 6), (4, 7)])
    return t


def scenario_random(
    module: Any, seed: int = 7, dtype: str = "bf16", mode: str = "exact",
    kv_layout: str | None = None,
) -> Transcript:  # fmt: skip
    """Prefix-sharing requests under a small pool, with fence faults: the trace generator's mix."""
    rng = random.Random(seed)
    region_blocks = 3
    driver = Driver(
        module,
        num_layers=4,
        dtype=dtype,
        block_size=2,
        num_kv_heads=2,
        head_dim=3,
        slots=8,
        num_regions=6,
        region_blocks=region_blocks,
        num_device_blocks=8,
        mode=mode,
        kv_layout=kv_layout,
    )
    t = Transcript(driver)
    prompts: list[list[int]] = []
    for _ in range(40):
        shared: list[int] = []
        if prompts and rng.random() < 0.7:
            base = rng.choice(prompts[-4:])  # recent requests: their prefix may still be held
            shared = base[: rng.randint(1, len(base))]
        chain = shared + [rng.getrandbits(64) for _ in range(rng.randint(1, region_blocks))]
        prompts.append(chain)
        t.lookup(chain)
        devices = rng.sample(range(8), 8)
        loads = shared[:region_blocks]
        stores = chain[len(loads) :][:region_blocks]
        faults = []
        if rng.random() < 0.08:
            faults.append((rng.choice(["load", "store"]), rng.randrange(4)))
        t.step(
            seed=rng.getrandbits(32),
            loads=list(zip(loads, devices, strict=False)),
            stores=list(zip(stores, devices[len(loads) :], strict=False)),
            faults=faults,
        )
    return t


SCENARIOS: dict[str, Callable[[Any], Transcript]] = {
    "round_trip": scenario_round_trip,
    "lru_pins_refusal": scenario_lru_pins_refusal,
    "duplicates": scenario_duplicates,
    "faults": scenario_faults,
    "all_quarantined": scenario_all_quarantined,
    "one_region": scenario_one_region,
    "no_forward": scenario_no_forward,
    "extents": scenario_extents,
    "load_targets": scenario_load_targets,
    "plan_step": scenario_plan_step,
    "huge_region_blocks": scenario_huge_region_blocks,
    "random_bf16": lambda module: scenario_random(module, 7, "bf16"),
    "random_fp32": lambda module: scenario_random(module, 8, "fp32"),
    "random_fp16": lambda module: scenario_random(module, 9, "fp16"),
    # The compressed modes move the same bytes through the same steps; only the codec differs.
    "random_bf16_int8": lambda module: scenario_random(module, 10, "bf16", "int8"),
    "random_fp16_fp8": lambda module: scenario_random(module, 11, "fp16", "fp8_e4m3"),
    "random_fp32_int8": lambda module: scenario_random(module, 12, "fp32", "int8"),
}


# ---- bad input and hooks out of order: (name, call, error, text the message holds) ----


def _bad_layers(driver: Driver) -> list[tuple[str, Callable[[], Any], str]]:
    kv = driver.kv
    shape = kv[0].shape

    def replaced(index: int, array: Any) -> list[Any]:
        layers = list(kv)
        layers[index] = array
        return layers

    read_only = np.zeros(shape, dtype=kv[0].dtype)
    read_only.flags.writeable = False
    # One byte past an element boundary: C-contiguous, writable, of the right dtype and shape.
    raw = np.zeros(kv[0].nbytes + 1, np.uint8)[1:]
    misaligned = raw.view(kv[0].dtype).reshape(shape)
    wide = np.zeros((*shape[:-1], 2 * shape[-1]), dtype=kv[0].dtype)
    # Words 17 bytes apart along the last dimension: strides that split elements (SPEC.md §1).
    spread = np.zeros(kv[0].size * 17 + 4, np.uint8)
    strides = tuple(stride // kv[0].itemsize * 17 for stride in kv[0].strides)
    split = np.ndarray(shape, kv[0].dtype, spread, 0, strides)
    # vLLM's view form [B, H, T, 2 * D], aligned at its start, its tokens 17 bytes apart.
    blocks, tokens, heads, dim = shape[1:]
    split_view = np.ndarray((blocks, heads, tokens, 2 * dim), kv[0].dtype, spread, 0,
                            (tokens * 17 * heads, tokens * 17, 17, kv[0].itemsize))  # fmt: skip
    scalar = kv[2].dtype.type(0)
    swapped = np.zeros(shape, ">f2")  # the layout's fp16, byte-swapped
    register = driver.engine.register_kv_caches
    return [
        ("too few layers", lambda: register(kv[:-1]), "layers: expected num_layers = 3"),
        ("not an array", lambda: register(replaced(1, [[0]])), "layers[1]"),
        ("wrong dtype", lambda: register(replaced(2, kv[2].astype(np.uint32))), "layers[2]"),
        # Of the right width but neither raw words nor the layout's dtype (fp16).
        ("signed words", lambda: register(replaced(0, kv[0].view(np.int16))), "layers[0]"),
        ("wrong shape", lambda: register(replaced(1, kv[1][:, :4])), "layers[1]: expected shape"),
        ("wrong ndim", lambda: register(replaced(1, kv[1].reshape(-1))), "layers[1]"),
        ("strided", lambda: register(replaced(1, wide[..., ::2])), "layers[1]: expected a C-"),
        ("fortran", lambda: register(replaced(0, np.asfortranarray(kv[0]))), "C-contiguous"),
        ("read-only", lambda: register(replaced(2, read_only)), "layers[2]: expected a writable"),
        # What neither DLPack nor the buffer protocol hands over: named by dtype or strides.
        (
            "byte-swapped own dtype",
            lambda: register(replaced(1, swapped)),
            "layers[1]: expected an array in this machine's byte order; got one of dtype >f2",
        ),
        ("objects", lambda: register(replaced(0, kv[0].astype(object))), "got one of dtype object"),
        (
            "a scalar",
            lambda: register(replaced(2, scalar)),
            "layers[2]: expected an array (numpy or DLPack); got a uint16 scalar",
        ),
        (
            "split elements",
            lambda: register(replaced(1, split)),
            "layers[1]: expected strides that are multiples of its 2-byte elements; got "
            "[1088, 136, 68, 68, 17] (in bytes)",
        ),
        (
            "split elements of a view",
            lambda: register(replaced(0, split_view)),
            "layers[0]: expected strides that are multiples of its 2-byte elements; got "
            "[34, 34, 17, 2] (in bytes)",
        ),
        (
            "misaligned",
            lambda: register(replaced(1, misaligned)),
            "layers[1]: expected an array "
            "aligned to its 2-byte elements; got one that starts 1 byte(s) past",
        ),
    ]


def bad_inputs(driver: Driver) -> list[tuple[str, Callable[[], Any], str]]:
    """Calls with bad input (ValueError), each naming the argument; the engine is planning."""
    engine = driver.engine
    return [
        *_bad_layers(driver),
        ("lengths", lambda: engine.plan_load([1, 2], [0]), "device_blocks: expected one"),
        ("device -1", lambda: engine.plan_load([1], [-1]), "device_blocks[0]"),
        ("device 8", lambda: engine.plan_store([1, 2], [0, 8]), "device_blocks[1]"),
        ("device float", lambda: engine.plan_store([1], [0.5]), "device_blocks[0]"),
        ("hash negative", lambda: engine.lookup([1, -1]), "hashes[1]"),
        ("hash 2**64", lambda: engine.plan_load([2**64], [0]), "hashes[0]"),
        ("hash str", lambda: engine.plan_store(["x"], [0]), "hashes[0]"),
        ("too many loads", lambda: engine.plan_load([1, 2, 3, 4, 5], range(5)), "region_blocks"),
        # Loads that are good, stores that are not: nothing planned (SPEC.md §6 rule 11), so
        # check_usable's first step has no leftover load of 501 into device block 2.
        (
            "half-refused step",
            lambda: engine.plan_step([501], [2], [9], [8]),
            "store_device_blocks[0]: expected 0 <= device block < 8; got 8",
        ),
        (
            "half-refused step, a store limit",
            lambda: engine.plan_step([501], [2], [1, 2, 3, 4, 5], range(5)),
            "store_hashes: a step moves at most region_blocks = 4",
        ),
        ("plan_step load hash", lambda: engine.plan_step([-1], [2], [], []), "load_hashes[0]"),
        ("layer -1", lambda: engine.wait_for_layer_load(-1), "layer: expected 0 <= layer < 3"),
        ("layer 2**70", lambda: engine.wait_for_layer_load(2**70), "layer: expected 0 <= layer"),
        ("fault layer -2**64", lambda: engine.inject_fence_fault("store", -(2**64)), "layer"),
        ("layer 3", lambda: engine.save_kv_layer(3), "layer"),
        ("fault layer", lambda: engine.inject_fence_fault("load", 3), "layer"),
        ("direction", lambda: engine.inject_fence_fault("sideways", 0), "direction"),
    ]


def out_of_order_calls(driver: Driver) -> list[tuple[str, Callable[[], Any], str]]:
    """Hooks out of order (RuntimeError) for an engine between steps."""
    engine = driver.engine
    return [
        ("start_load first", engine.start_load, "expected plan_load, plan_store or build_step"),
        ("wait first", lambda: engine.wait_for_layer_load(0), "out of order"),
        ("save first", lambda: engine.save_kv_layer(0), "out of order"),
        ("wait_for_save first", engine.wait_for_save, "out of order"),
    ]


def raised(call: Callable[[], Any]) -> tuple[type[BaseException], str]:
    """The exception type that `call` raises, mapped to its builtin base, and its message."""
    try:
        call()
    except (ValueError, RuntimeError, TypeError) as error:
        for base in (ValueError, RuntimeError, TypeError):
            if isinstance(error, base):
                return base, str(error)
    raise AssertionError("expected an exception")


def check_usable(driver: Driver) -> list[Any]:
    """After refused calls: a full store-and-load cycle works; what it observed."""
    driver.fill(123)
    first = driver.step(stores=[(501, 0), (502, 1)])
    events = driver.events()
    second = driver.step(loads=[(501, 2)])
    return [first, events, second, driver.events(), driver.kv_bytes()]


# ---- the reference against SPEC.md ----


def make(**geometry: Any) -> Driver:
    return Driver(reference, **geometry)


def test_stored_block_bytes_exact():
    layout = SimpleNamespace(num_layers=3, block_size=16, num_kv_heads=2, head_dim=64, dtype="bf16")
    assert reference.stored_layer_bytes(layout, "exact") == 2 * 16 * 2 * 64 * 2
    assert reference.stored_block_bytes(layout, "exact") == 3 * 2 * 16 * 2 * 64 * 2
    k = np.arange(16 * 2 * 64, dtype=np.uint16).reshape(16, 2, 64)
    stored = reference.encode_layer(layout, "exact", k, k[::-1].copy())
    back_k, back_v = reference.decode_layer(layout, "exact", stored)
    assert np.array_equal(back_k, k) and np.array_equal(back_v, k[::-1])
    with pytest.raises(ValueError, match="mode"):
        reference.stored_block_bytes(layout, "zip")


def test_round_trip_restores_every_byte_and_logs_in_plan_order():
    driver = make(slots=8)
    driver.fill(1)
    original = [layer.copy() for layer in driver.kv]
    assert driver.step(stores=[(11, 0), (12, 5)]) == [[], [], []]
    assert driver.events() == [("commit", 11), ("commit", 12)]
    assert driver.engine.lookup([11, 12, 13]) == 2
    assert driver.events() == [("lookup", 2)]
    for layer in driver.kv:
        layer[...] = 0
    assert driver.step(loads=[(12, 3), (11, 7), (99, 1)]) == [[], [], []]
    assert driver.events() == [
        ("hit", 12),
        ("hit", 11),
        ("miss", 99),
        ("loaded", 12),
        ("loaded", 11),
    ]
    for layer, before in zip(driver.kv, original, strict=True):
        assert np.array_equal(layer[:, 3], before[:, 5])
        assert np.array_equal(layer[:, 7], before[:, 0])
        assert not layer[:, [0, 1, 2, 4, 5, 6]].any()  # nothing else written


def test_lookup_is_pure():
    driver = make(slots=2)
    driver.step(stores=[(1, 0)])
    driver.step(stores=[(2, 1)])
    driver.events()
    for _ in range(3):
        assert driver.engine.lookup([1, 2]) == 2  # looking 1 up does not make it recent
    assert driver.engine.lookup([2, 3, 1]) == 1
    driver.step(stores=[(3, 2)])
    assert driver.events()[-2:] == [("evict", 1), ("commit", 3)]


def test_lru_evicts_the_least_recently_used_and_loads_refresh():
    transcript = scenario_lru_pins_refusal(reference)
    steps = [record[2] for record in transcript.records if record[0] == "step"]
    assert steps[3] == [("evict", 2), ("commit", 3)]
    # Both committed blocks pinned by loads: the store is refused, nothing evicted.
    assert steps[4] == [("hit", 1), ("hit", 3), ("refuse", 4), ("loaded", 1), ("loaded", 3)]
    # Block 3 pinned: block 1 goes; then every unpinned block is gone and 5 is refused.
    assert steps[5] == [("hit", 3), ("evict", 1), ("refuse", 5), ("loaded", 3), ("commit", 4)]
    assert transcript.records[-1] == ("lookup", 2, [("lookup", 2)])


def _extents(transcript: Transcript) -> list[dict[str, int]]:
    return [record[1][4] for record in transcript.records if record[0] == "state"]


def test_a_step_takes_one_extent_and_a_prefix_loads_back_as_one_run():
    stats = _extents(scenario_extents(reference))
    assert stats[0]["last_store_runs"] == 1 and stats[0]["last_store_direct_runs"] == 1
    assert stats[1]["last_store_runs"] == 1 and stats[1]["last_store_direct_runs"] == 0
    assert (stats[2]["last_load_blocks"], stats[2]["last_load_runs"]) == (3, 1)
    assert stats[2]["last_load_direct_runs"] == 1  # device blocks 8, 9, 10
    assert (stats[2]["free_slots"], stats[2]["free_runs"]) == (0, 0)
    assert (stats[2]["store_steps"], stats[2]["extents"], stats[2]["split_steps"]) == (3, 3, 0)


def test_evicted_slots_coalesce_before_the_step_is_placed():
    transcript = scenario_extents(reference)
    steps = [record[2] for record in transcript.records if record[0] == "step"]
    # Whole extents (by slot), least recently used first: more slots than the step needs.
    assert [event for event in steps[3] if event[0] == "evict"] == [
        ("evict", 5), ("evict", 6), ("evict", 7), ("evict", 2), ("evict", 3), ("evict", 4)
    ]  # fmt: skip
    stats = _extents(transcript)[3]
    assert (stats["last_store_blocks"], stats["last_store_runs"]) == (4, 1)  # slots 1..4
    assert (stats["free_slots"], stats["free_runs"]) == (2, 1)  # slots 5, 6
    assert stats["split_steps"] == 0


def test_a_fragmented_pool_splits_a_step_and_counts_it():
    transcript = scenario_extents(reference)
    steps = [record[2] for record in transcript.records if record[0] == "step"]
    assert [event for event in steps[4] if event[0] in ("evict", "drop")] == [
        ("evict", 8), ("evict", 14), ("drop", 20), ("drop", 21), ("drop", 22), ("drop", 26)
    ]  # fmt: skip
    stats = _extents(transcript)
    # Slots 5..7 and 9: the run of 3 whole, then slot 9; twice (the drop gives them back).
    for index in (4, 5):
        assert (stats[index]["last_store_blocks"], stats[index]["last_store_runs"]) == (4, 2)
    assert stats[4]["free_runs"] == 2 and stats[4]["free_slots"] == 4
    assert stats[5]["free_slots"] == 0
    final = stats[-1]
    assert (final["store_steps"], final["extents"], final["split_steps"]) == (6, 8, 2)
    assert (final["split_blocks"], final["single_slot_blocks"]) == (8, 2)
    assert (final["last_load_blocks"], final["last_load_runs"]) == (4, 1)
    assert final["last_store_blocks"] == 0


def test_placement_follows_the_rule_of_the_spec():
    """The reference's _take on hand-made free lists: best fit, else largest runs whole."""
    engine = make(slots=16).engine
    engine._free = [0, 2, 3, 6, 7, 8, 10, 13, 14, 15]  # runs: 0, 2-3, 6-8, 10, 13-15
    assert engine._take(7) == [(6, 3), (13, 3), (0, 1)]
    assert engine._free == [2, 3, 10]
    engine._free = [0, 1, 2, 5, 6, 7, 8, 12, 13, 14]  # runs of 3, 4, 3
    assert engine._take(3) == [(0, 3)]
    assert engine._take(2) == [(12, 2)]  # the run of 3 before the run of 4
    engine._free = [0, 1, 2, 3, 5, 6, 8, 9]  # runs of 4, 2 and 2
    assert engine._take(7) == [(0, 4), (5, 2), (8, 1)]


def test_negative_control_splits_over_the_smallest_runs(monkeypatch):
    assert {"extent_split_smallest"} <= reference.KNOWN_FAULTS
    monkeypatch.setattr(reference, "FAULTS", {"extent_split_smallest"})
    engine = make(slots=16).engine
    engine._free = [0, 1, 2, 3, 5, 6, 8, 9]  # runs of 4, 2 and 2
    assert engine._take(7) == [(5, 2), (8, 2), (0, 3)]  # the rule: [(0, 4), (5, 2), (8, 1)]


def test_negative_control_evicts_the_most_recent(monkeypatch):
    assert reference.FAULTS == set()  # off by default
    assert {"lru_mru_first"} <= reference.KNOWN_FAULTS
    monkeypatch.setattr(reference, "FAULTS", {"lru_mru_first"})
    driver = make(slots=2)
    driver.step(stores=[(1, 0)])
    driver.step(stores=[(2, 1)])
    driver.events()
    driver.step(stores=[(3, 2)])
    assert driver.events() == [("evict", 2), ("commit", 3)]


def test_pins_are_counted():
    driver = make(slots=1)
    driver.step(stores=[(7, 0)])
    driver.events()
    driver.engine.plan_load([7, 7], [1, 2])
    driver.engine.build_step()
    driver.engine.start_load()
    driver.engine.wait_for_layer_load(0)
    assert driver.engine._blocks[7]["pins"] == 2
    driver.engine.save_kv_layer(0)
    for layer in (1, 2):
        driver.engine.wait_for_layer_load(layer)
        driver.engine.save_kv_layer(layer)
    driver.engine.wait_for_save()
    assert driver.engine._blocks[7]["pins"] == 0
    assert driver.events() == [("hit", 7), ("hit", 7), ("loaded", 7), ("loaded", 7)]
    assert np.array_equal(driver.kv[0][:, 1], driver.kv[0][:, 0])
    assert np.array_equal(driver.kv[2][:, 2], driver.kv[2][:, 0])


def test_storing_a_committed_or_planned_hash_does_nothing():
    transcript = scenario_duplicates(reference)
    assert transcript.records[2][2] == [("commit", 2)]
    assert transcript.driver.engine._free == [2, 3]


def test_load_fault_loses_blocks_from_that_layer_and_quarantines():
    driver = make(slots=4)
    driver.step(stores=[(1, 0), (2, 1)])
    driver.events()
    lost = driver.step(loads=[(1, 4), (2, 5)], faults=[("load", 1)])
    assert lost == [[], [4, 5], [4, 5]]
    # Layer 1 went to region 1 while layer 0 was still in flight in region 0.
    assert driver.events() == [
        ("hit", 1),
        ("hit", 2),
        ("quarantine", 1),
        ("load_error", 1),
        ("load_error", 2),
    ]
    assert driver.engine.quarantined_regions == 1
    assert not driver.engine.fatal
    for _ in range(3):  # the region is never taken again
        assert driver.step(loads=[(1, 4)]) == [[], [], []]
        assert driver.engine._staging.regions[1]["state"] == "quarantined"
    assert driver.engine.quarantined_regions == 1


def test_store_fault_drops_blocks_and_frees_their_slots():
    driver = make(slots=4)
    driver.step(stores=[(1, 0), (2, 1)], faults=[("store", 2), ("store", 2)])
    assert driver.events() == [("quarantine", 0), ("drop", 1), ("drop", 2)]
    assert driver.engine._free == [0, 1, 2, 3]
    driver.step(stores=[(3, 2)])  # takes the second injected fault
    assert driver.events() == [("quarantine", 1), ("drop", 3)]
    assert driver.engine.lookup([1, 3]) == 0
    assert driver.events() == [("lookup", 0)]
    driver.step(stores=[(3, 2)])
    assert driver.events() == [("commit", 3)]


def test_all_quarantined_is_fatal_once_and_never_hangs():
    driver = make(num_regions=1)
    driver.step(stores=[(1, 0)])
    driver.events()
    lost = driver.step(loads=[(1, 3)], stores=[(2, 1)], faults=[("load", 0)])
    assert lost == [[3], [3], [3]]
    assert driver.events() == [
        ("hit", 1),
        ("quarantine", 0),
        ("fatal", 1),
        ("load_error", 1),
        ("drop", 2),
    ]
    assert driver.engine.fatal
    for _ in range(3):
        assert driver.step(loads=[(1, 3)], stores=[(5, 4)]) == [[3], [3], [3]]
        assert driver.events() == [("hit", 1), ("load_error", 1), ("drop", 5)]
    assert driver.engine.lookup([1]) == 1
    assert driver.engine.quarantined_regions == 1


def test_layer_n_plus_one_is_issued_before_layer_n_completes():
    driver = make()
    driver.step(stores=[(1, 0)])
    engine = driver.engine
    regions = engine._staging.regions
    engine.plan_load([1], [1])
    engine.plan_store([2], [2])
    engine.build_step()
    engine.start_load()
    assert regions[0]["state"] == "in_flight"
    engine.wait_for_layer_load(0)
    assert [r["state"] for r in regions[:2]] == ["free", "in_flight"]
    engine.save_kv_layer(0)
    assert regions[0]["state"] == "in_flight"  # store layer 0
    engine.wait_for_layer_load(1)
    assert [r["state"] for r in regions[:3]] == ["in_flight", "free", "in_flight"]
    engine.save_kv_layer(1)
    assert [r["state"] for r in regions[:3]] == ["free", "in_flight", "in_flight"]


def test_one_region_completes_before_issuing():
    transcript = scenario_one_region(reference)
    records = [r for r in transcript.records if r[0] == "step"]
    assert records[0][2] == [("commit", 1), ("commit", 2)]
    assert records[1][1] == [[], [], []]
    # The load's next layer holds the only region when the store is issued: the store is dropped.
    assert records[2][2] == [("hit", 2), ("loaded", 2), ("drop", 3)]


def test_no_forward_step_may_skip_the_layer_hooks():
    transcript = scenario_no_forward(reference)
    assert transcript.records[0] == ("no_forward", [("miss", 42)])
    driver = make()
    driver.engine.plan_store([1], [0])
    driver.engine.build_step()
    driver.engine.start_load()
    with pytest.raises(RuntimeError, match="wait_for_layer_load\\(0\\)"):
        driver.engine.wait_for_save()


def test_staging_leases_state_machine():
    staging = reference.Staging(2, 2)
    status, lease = staging.prepare()
    assert (status, lease) == ("ok", (0, 0))
    calls = []

    def copies(transfers):
        calls.append(list(transfers))

    def snapshot():
        return [(r["state"], r["generation"], list(r["transfers"])) for r in staging.regions]

    def stale(call, text):
        before = snapshot()
        with pytest.raises(RuntimeError, match=text):
            call()
        assert snapshot() == before

    stale(lambda: staging.transfer(lease, True, copies), "not bound")
    stale(lambda: staging.complete(lease), "not in_flight")
    stale(lambda: staging.bind((0, 1), [(0, 0)]), "generation")
    with pytest.raises(ValueError, match="region_blocks = 2"):
        staging.bind(lease, [(0, 0)] * 3)
    staging.bind(lease, [(5, 1)])
    stale(lambda: staging.bind(lease, [(5, 1)]), "not prepared")
    staging.transfer(lease, True, copies)
    stale(lambda: staging.transfer(lease, True, copies), "in_flight")
    assert staging.complete(lease) == "ok"
    assert calls == [[(5, 1)]]
    assert staging.regions[0]["generation"] == 1
    stale(lambda: staging.complete(lease), "generation")
    stale(lambda: staging.bind((7, 0), []), "regions")

    # An unknown fence quarantines for good: nothing delivered, never prepared again.
    status, lease = staging.prepare()
    assert lease == (0, 1)
    staging.bind(lease, [])
    staging.transfer(lease, False, copies)
    assert staging.complete(lease) == "lost"
    assert len(calls) == 2  # the copies ran; only the fence's outcome is unknown
    assert staging.prepare() == ("ok", (1, 0))
    assert staging.prepare() == ("no_region", None)
    assert staging.quarantined() == 1
    stale(lambda: staging.complete(lease), "quarantined")


@pytest.mark.parametrize("index", range(len(bad_inputs(make()))))
def test_bad_input_is_a_value_error_that_changes_nothing(index):
    driver = make()
    name, call, text = bad_inputs(driver)[index]
    before = driver.kv_bytes()
    error, message = raised(call)
    assert error is ValueError, name
    assert text in message, name
    assert driver.kv_bytes() == before
    assert check_usable(driver) == check_usable_fresh()


def check_usable_fresh() -> list[Any]:
    return check_usable(make())


@pytest.mark.parametrize("index", range(len(out_of_order_calls(make()))))
def test_hooks_out_of_order_are_runtime_errors_that_change_nothing(index):
    driver = make()
    name, call, text = out_of_order_calls(driver)[index]
    error, message = raised(call)
    assert error is RuntimeError, name
    assert text in message, name
    assert check_usable(driver) == check_usable_fresh()


def test_hooks_out_of_order_mid_step():
    driver = make()
    engine = driver.engine
    engine.plan_load([1], [0])
    engine.build_step()
    for call in (engine.build_step, lambda: engine.plan_load([2], [1])):
        with pytest.raises(RuntimeError, match="expected start_load next"):
            call()
    engine.register_kv_caches(driver.kv)  # allowed until the step runs (SPEC §6 rule 8)
    engine.start_load()
    with pytest.raises(RuntimeError, match="register_kv_caches"):
        engine.register_kv_caches(driver.kv)
    with pytest.raises(RuntimeError, match="expected wait_for_layer_load\\(0\\) next"):
        engine.save_kv_layer(0)
    engine.wait_for_layer_load(0)
    with pytest.raises(RuntimeError, match="expected save_kv_layer\\(0\\) next"):
        engine.wait_for_layer_load(1)
    for layer in range(3):
        if layer:
            engine.wait_for_layer_load(layer)
        engine.save_kv_layer(layer)
    with pytest.raises(RuntimeError, match="expected wait_for_save next"):
        engine.save_kv_layer(2)
    engine.wait_for_save()
    assert driver.events() == [("miss", 1)]


def test_start_load_needs_registered_kv():
    layout = SimpleNamespace(num_layers=1, block_size=1, num_kv_heads=1, head_dim=1, dtype="fp32")
    engine = reference.Engine(layout, "exact", 8, 1, 1, 1)
    engine.build_step()
    with pytest.raises(RuntimeError, match="register_kv_caches"):
        engine.start_load()


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (("zip", 100, 1, 1, 1), "mode"),
        (("exact", -1, 1, 1, 1), "capacity_bytes: expected a non-negative"),
        (("exact", 7, 1, 1, 1), "capacity_bytes: expected room for at least one slot of 8"),
        (("exact", 8, 0, 1, 1), "num_regions"),
        (("exact", 8, 1, 0, 1), "region_blocks"),
        (("exact", 8, 1, 1, 0), "num_device_blocks"),
        (("exact", 8, 1, 1, -5), "num_device_blocks"),
        (("exact", 2**63, 1, 1, 1), "capacity_bytes: expected a non-negative integer below 2"),
        (("exact", 8, 1, 2**70, 1), "region_blocks: expected a non-negative integer below 2"),
        (("exact", 2**62, 1, 1, 1), "capacity_bytes: expected a pool that fits in this machine"),
        # Before the pool's memory: a pool no machine holds is not what is named.
        (("exact", 2**62, 2**20 + 1, 1, 1), "num_regions: expected at most 1048576; got 1048577"),
    ],
)
def test_construction_errors(arguments, text):
    layout = SimpleNamespace(num_layers=1, block_size=1, num_kv_heads=1, head_dim=1, dtype="fp32")
    with pytest.raises(ValueError, match=text):
        reference.Engine(layout, *arguments)


def test_a_refused_plan_step_plans_nothing():
    transcript = scenario_plan_step(reference)
    refused = [record[1] for record in transcript.records if record[0] == "refused"]
    limit = "a step moves at most region_blocks = 2 blocks each way; plan_step would plan 3"
    elsewhere = "expected a device block no other hash of this step loads into; got"
    assert refused == [
        (ValueError, "store_device_blocks[0]: expected 0 <= device block < 8; got 8"),
        (ValueError, f"store_hashes: {limit}"),
        (ValueError, f"load_device_blocks[1]: {elsewhere} 5 (hash 1's)"),
        (ValueError, "store_device_blocks: expected one device block per hash (2); got 1"),
        (ValueError, "store_hashes[0]: expected an unsigned 64-bit block hash; got 'x'"),
        (ValueError, f"store_hashes: {limit}"),
    ]
    steps = [record for record in transcript.records if record[0] == "step"]
    assert steps[1][2] == []  # no load of 1 left from a refused call
    assert steps[2][2] == [("hit", 1), ("hit", 2), ("loaded", 1), ("loaded", 2), ("commit", 9)]


def test_a_half_refused_step_leaves_its_loads_unplanned_with_plan_load_it_does_not():
    """The negative control of rule 11: planned apart, a refused store leaves the loads."""
    driver = make(slots=4)
    driver.fill(1)
    driver.step(stores=[(1, 5)])
    driver.events()
    driver.engine.plan_load([1], [2])
    with pytest.raises(ValueError, match="device_blocks"):
        driver.engine.plan_store([9], [8])
    driver.step()
    assert driver.events() == [("hit", 1), ("loaded", 1)]


def test_any_region_blocks_serves():
    records = scenario_huge_region_blocks(reference).records
    steps = [record[2] for record in records if record[0] == "step"]
    assert steps == [
        [("commit", 1), ("commit", 2)],
        [("evict", 1), ("evict", 2), ("refuse", 5), ("commit", 3), ("commit", 4)],
        [("hit", 3), ("hit", 4), ("loaded", 3), ("loaded", 4)],
    ]


def test_a_device_block_receives_one_hash_per_step():
    transcript = scenario_load_targets(reference)
    refused = [record[1] for record in transcript.records if record[0] == "refused"]
    expected = "expected a device block no other hash of this step loads into; got"
    assert refused == [
        (ValueError, f"device_blocks[1]: {expected} 5 (hash 2's)"),
        (ValueError, f"device_blocks[2]: {expected} 6 (hash 3's)"),
    ]
    steps = [record[2] for record in transcript.records if record[0] == "step"]
    assert steps[1] == [("hit", 1), ("hit", 1), ("loaded", 1), ("loaded", 1)]
    assert steps[2] == [("hit", 2), ("hit", 3), ("loaded", 2), ("loaded", 3)]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenarios_are_deterministic(name):
    first = SCENARIOS[name](reference).records
    assert first == SCENARIOS[name](reference).records
    assert any(record[0] == "step" for record in first)
