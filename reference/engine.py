"""Plain Python reference of the engine's CPU route (engine/offload/SPEC.md §2-§4, §6, §7).

Written to be obviously correct rather than fast, and independently of the C++ engine
(engine/offload/engine.cpp): dicts, lists and explicit loops. Same API as ``activekv._engine``:
``stored_block_bytes``, ``encode_layer``, ``decode_layer`` and the ``Engine`` class, with the same
events and the same errors (ValueError for bad input, RuntimeError for hooks out of order; either
leaves the engine as it was).

Storage in every mode (exact, int8, fp8_e4m3) comes from ``reference/compression.py``;
its functions are re-exported here.

``layout`` is any object with ``num_layers``, ``block_size``, ``num_kv_heads``, ``head_dim`` and
``dtype`` ("fp16", "bf16", "fp32", or an enum whose ``.name`` is one of those).

``FAULTS`` is for the parity gate's negative controls only (never set it otherwise):
``"lru_mru_first"`` evicts the most recently used unpinned block alone instead of the least
recently used extent;
``"extent_split_smallest"`` splits a step that no free run holds over the smallest free runs
first instead of the largest, which no event shows but ``extent_stats`` does.
"""

from __future__ import annotations

import operator
import os
from typing import Any

import numpy as np

from .compression import (
    WORDS,
    check_mode,
    checked_alignment,
    checked_layout_in_memory,
    decode_layer,
    dtype_name,
    encode_layer,
    stored_block_bytes,
    stored_layer_bytes,
)

__all__ = ["Engine", "decode_layer", "encode_layer", "stored_block_bytes", "stored_layer_bytes"]

# A KV-cache layer's elements: its raw words (WORDS) or the layout's own dtype, by numpy's name
# ("bfloat16" where ml_dtypes provides it; numpy itself has none).
_OWN_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}

# The most staging regions an engine may have (SPEC.md §7).
MAX_REGIONS = 2**20

KNOWN_FAULTS = frozenset({"lru_mru_first", "extent_split_smallest"})
FAULTS: set[str] = set()

# Region states (SPEC.md §4).
FREE = "free"
PREPARED = "prepared"
BOUND = "bound"
IN_FLIGHT = "in_flight"
QUARANTINED = "quarantined"


# ---- staging regions and leases (SPEC.md §4) ----


class Staging:
    """num_regions regions, each {state, generation, transfers, fence}; a region owns no bytes,
    the copies go straight between slots and device blocks. A lease is the tuple (region,
    generation). Any use of a lease that does not match its region raises RuntimeError ("stale
    lease") and changes nothing."""

    def __init__(self, num_regions: int, region_blocks: int) -> None:
        self.region_blocks = region_blocks
        self.regions: list[dict[str, Any]] = [
            {"state": FREE, "generation": 0, "transfers": [], "fence_ok": True}
            for _ in range(num_regions)
        ]

    def quarantined(self) -> int:
        return sum(1 for region in self.regions if region["state"] == QUARANTINED)

    def all_quarantined(self) -> bool:
        return self.quarantined() == len(self.regions)

    def prepare(self) -> tuple[str, tuple[int, int] | None]:
        """("ok", lease) | ("no_region", None) | ("all_quarantined", None)."""
        if self.all_quarantined():
            return "all_quarantined", None
        for index, region in enumerate(self.regions):
            if region["state"] == FREE:
                region["state"] = PREPARED
                return "ok", (index, region["generation"])
        return "no_region", None

    def _leased(self, lease: tuple[int, int], needed: str, call: str) -> dict[str, Any]:
        index, generation = lease
        if not 0 <= index < len(self.regions):
            raise RuntimeError(
                f"{call}: stale lease {lease}: there are {len(self.regions)} regions"
            )
        region = self.regions[index]
        if region["generation"] != generation:
            raise RuntimeError(
                f"{call}: stale lease {lease}: the region is at generation {region['generation']}"
            )
        if region["state"] != needed:
            raise RuntimeError(
                f"{call}: stale lease {lease}: the region is {region['state']}, not {needed}"
            )
        return region

    def bind(self, lease: tuple[int, int], transfers: list[tuple[int, int]]) -> None:
        """transfers: (slot, device_block) per block."""
        region = self._leased(lease, PREPARED, "bind")
        if len(transfers) > self.region_blocks:
            raise ValueError(
                f"transfers: expected at most region_blocks = {self.region_blocks} entries; "
                f"got {len(transfers)}"
            )
        region["transfers"] = list(transfers)
        region["state"] = BOUND

    def transfer(self, lease: tuple[int, int], fence_ok: bool, copies: Any) -> None:
        """Runs copies(transfers) now, then the region is in flight behind its fence."""
        region = self._leased(lease, BOUND, "transfer")
        copies(region["transfers"])
        region["fence_ok"] = fence_ok
        region["state"] = IN_FLIGHT

    def complete(self, lease: tuple[int, int]) -> str:
        """ "ok" (the region is free, generation + 1) or "lost" (quarantined for good)."""
        region = self._leased(lease, IN_FLIGHT, "complete")
        if not region["fence_ok"]:
            region["state"] = QUARANTINED
            region["transfers"] = []
            return "lost"
        region["transfers"] = []
        region["state"] = FREE
        region["generation"] += 1
        return "ok"


# ---- the engine ----


def _integers(values: Any, name: str, low: int, high: int, expected: str) -> list[int]:
    """Items of an iterable as ints in [low, high); ValueError naming name[i] otherwise (a value
    that is not iterable raises TypeError, as iterating it does)."""
    result = []
    for index, item in enumerate(values):
        try:
            value = operator.index(item)
        except TypeError:
            raise ValueError(f"{name}[{index}]: expected {expected}; got {item!r}") from None
        if not low <= value < high:
            raise ValueError(f"{name}[{index}]: expected {expected}; got {item!r}")
        result.append(value)
    return result


def _hashes(values: Any, name: str = "hashes") -> list[int]:
    return _integers(values, name, 0, 2**64, "an unsigned 64-bit block hash")


def _device_blocks(values: Any, name: str = "device_blocks") -> list[int]:
    return _integers(values, name, -(2**63), 2**63, "a device block index")


def _non_negative(value: Any, name: str) -> int:
    value = operator.index(value)
    if not 0 <= value < 2**63:
        raise ValueError(f"{name}: expected a non-negative integer below 2**63; got {value}")
    return value


def _is_own(dtype: np.dtype, own: str) -> bool:
    """Whether `dtype` is the layout's own dtype (numpy's name `own`) in this machine's byte
    order: a byte-swapped one has the same name but other bits."""
    return dtype.name == own and dtype.isnative


def _check_exportable(array: Any, name: str) -> None:
    """What the bindings cannot take over at all (neither DLPack nor the buffer protocol hands it
    over), refused with their messages (bindings/kv_views.h): not an array, an array of no
    numbers, byte-swapped, or with strides that split its elements."""
    if isinstance(array, np.generic):
        raise ValueError(
            f"{name}: expected an array (numpy or DLPack); got a {type(array).__name__} scalar"
        )
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{name}: expected an array (numpy or DLPack); got {type(array).__name__}")
    dtype = array.dtype
    if dtype.kind not in "biufc" and dtype.name not in _OWN_DTYPES.values():
        # (bfloat16 from ml_dtypes is the reference's own, though no binding takes it.)
        raise ValueError(
            f"{name}: expected an array of numbers (numpy or DLPack); got one of dtype {dtype}"
        )
    if not dtype.isnative:
        raise ValueError(
            f"{name}: expected an array in this machine's byte order; got one of dtype {dtype} "
            f"(byte-swapped)"
        )
    # As numpy exports: a dimension of extent 1 may have any stride, never used.
    placed = zip(array.shape, array.strides, strict=True)
    if any(extent != 1 and stride % dtype.itemsize for extent, stride in placed):
        raise ValueError(
            f"{name}: expected strides that are multiples of its {dtype.itemsize}-byte elements; "
            f"got {list(array.strides)} (in bytes)"
        )


def _physical_memory_bytes() -> int:
    """This machine's physical memory (0 when the system does not say), as the engine reads it."""
    try:
        pages, page_bytes = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGESIZE")
    except (ValueError, OSError):
        return 0
    return pages * page_bytes if pages > 0 and page_bytes > 0 else 0


def _positive(value: int, name: str) -> int:
    if value == 0:
        raise ValueError(f"{name}: expected a positive value; got 0")
    return value


_COUNT_KEYS = ("store_steps", "extents", "split_steps", "split_blocks", "single_slot_blocks")
_RUN_KEYS = tuple(f"last_{direction}_{what}" for direction in ("load", "store")
                  for what in ("blocks", "runs", "direct_runs"))  # fmt: skip


def _runs_of(free: list[int]) -> list[tuple[int, int]]:
    """Sorted free slots as maximal (start, length) runs of consecutive slots."""
    runs: list[tuple[int, int]] = []
    for slot in free:
        if runs and runs[-1][0] + runs[-1][1] == slot:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((slot, 1))
    return runs


def transfer_runs(transfers: list[tuple[int, int]]) -> list[tuple[int, int, int, int, bool]]:
    """A layer's (slot, device_block) transfers as runs of consecutive host slots, in list order
    (SPEC.md §4, "Runs"): (first index, count, first slot, first device block, whether the device
    blocks are consecutive too). Adjacent entries only: nothing is sorted."""
    runs: list[tuple[int, int, int, int, bool]] = []
    for index, (slot, device) in enumerate(transfers):
        if runs:
            first, count, start, first_device, direct = runs[-1]
            if slot == start + count:
                runs[-1] = (first, count + 1, start, first_device,
                            direct and device == first_device + count)  # fmt: skip
                continue
        runs.append((index, 1, slot, device, True))
    return runs


class Engine:
    """Same methods, arguments, events and errors as activekv._engine.Engine (SPEC.md §7)."""

    def __init__(
        self,
        layout: Any,
        mode: str,
        capacity_bytes: int,
        num_regions: int,
        region_blocks: int,
        num_device_blocks: int,
    ) -> None:
        check_mode(mode)
        capacity_bytes = _non_negative(capacity_bytes, "capacity_bytes")
        num_regions = _non_negative(num_regions, "num_regions")
        region_blocks = _non_negative(region_blocks, "region_blocks")
        num_device_blocks = _non_negative(num_device_blocks, "num_device_blocks")
        self._layout = layout
        self._mode = mode
        self._num_layers = layout.num_layers
        self._word = WORDS[dtype_name(layout)]
        self._layer_bytes = stored_layer_bytes(layout, mode)
        slot_bytes = self._layer_bytes * self._num_layers
        if capacity_bytes < slot_bytes:
            raise ValueError(
                f"capacity_bytes: expected room for at least one slot of {slot_bytes} bytes; "
                f"got {capacity_bytes}"
            )
        _positive(num_regions, "num_regions")
        _positive(region_blocks, "region_blocks")
        _positive(num_device_blocks, "num_device_blocks")
        if num_regions > MAX_REGIONS:
            raise ValueError(f"num_regions: expected at most {MAX_REGIONS}; got {num_regions}")
        num_slots = capacity_bytes // slot_bytes
        physical = _physical_memory_bytes()
        if physical and num_slots * slot_bytes > physical:
            raise ValueError(
                f"capacity_bytes: expected a pool that fits in this machine's memory ({physical} "
                f"bytes); got {num_slots} slots of {slot_bytes} bytes"
            )

        self._slot_bytes = slot_bytes
        self._num_slots = num_slots
        self._region_blocks = region_blocks
        self._num_device_blocks = num_device_blocks
        # Host pool: slot -> its bytes; free slots kept sorted, read as runs of consecutive slots.
        self._slots = [bytearray(slot_bytes) for _ in range(self._num_slots)]
        self._free = list(range(self._num_slots))
        # The allocator's counts since construction and the last step's runs (SPEC.md §2, §7).
        self._counts = dict.fromkeys(_COUNT_KEYS, 0)
        self._last_runs = dict.fromkeys(_RUN_KEYS, 0)
        # hash -> {"slot", "state": "storing" | "committed", "pins", "last_use"}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._clock = 0
        self._extents = 0  # extents placed so far: a block's "extent" is the index of its run
        self._extent_stamps: dict[int, int] = {}
        self._staging = Staging(num_regions, region_blocks)
        self._fatal = False
        # (direction, layer) -> faults injected and not yet taken by a lease
        self._faults: dict[tuple[str, int], int] = {}
        self._events: list[tuple[str, int]] = []
        self._kv: list[tuple[np.ndarray, np.ndarray]] = []

        self._phase = "planning"  # "planning" -> "built" -> "running" -> "planning"
        self._planned_loads: list[tuple[int, int]] = []
        self._planned_stores: list[tuple[int, int]] = []
        self._loads: list[dict[str, Any]] = []  # {"hash", "device", "slot", "lost"}
        # {"hash", "device", "slot", "allocated", "dropped"}
        self._stores: list[dict[str, Any]] = []
        self._load_leases: list[dict[str, Any]] = []  # {"layer", "lease", "entries"}
        self._store_lease: dict[str, Any] | None = None
        self._layers_loaded = 0
        self._layers_saved = 0

    # ---- read-only properties ----

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes

    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def fatal(self) -> bool:
        return self._fatal

    @property
    def quarantined_regions(self) -> int:
        return self._staging.quarantined()

    @property
    def extent_stats(self) -> dict[str, int]:
        """Free slots and free runs now, the allocator's counts, the last step's runs."""
        free = {"free_slots": len(self._free), "free_runs": len(_runs_of(self._free))}
        return {**free, **self._counts, **self._last_runs}

    # ---- device KV ----

    def register_kv_caches(self, layers: Any) -> None:
        layers = list(layers)
        if len(layers) != self._num_layers:
            raise ValueError(
                f"layers: expected num_layers = {self._num_layers} arrays; got {len(layers)}"
            )
        views = [self._layer_view(array, f"layers[{index}]") for index, array in enumerate(layers)]
        if self._phase == "running":
            self._out_of_order("register_kv_caches")
        # Kept by reference, never copied: (K, V) views [num_device_blocks, T, H, D] of raw words
        # over the caller's memory.
        self._kv = views

    def _layer_view(self, array: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
        """SPEC.md §1: a layer in either form, as (K, V) views [B, T, H, D] of raw words."""
        layout = self._layout
        _check_exportable(array, name)
        if not array.flags.writeable:
            raise ValueError(
                f"{name}: expected a writable array (loads write into it); got a read-only one"
            )
        own = _OWN_DTYPES[dtype_name(layout)]
        types = f"raw words ({self._word.name}) or {own}, of dtype {dtype_name(layout)}"
        if array.ndim == 4:
            return self._vllm_layer_view(array, name, types)
        if array.dtype != self._word and not _is_own(array.dtype, own):
            raise ValueError(f"{name}: expected {types}; got {array.dtype}")
        expected_shape = [2, self._num_device_blocks, layout.block_size, layout.num_kv_heads,
                          layout.head_dim]  # fmt: skip
        if list(array.shape) != expected_shape:
            raise ValueError(
                f"{name}: expected shape [2, num_device_blocks, block_size, num_kv_heads, "
                f"head_dim] = {expected_shape}; got {list(array.shape)}"
            )
        checked_layout_in_memory(array, name)
        words = array.view(self._word)
        return words[0], words[1]

    def _vllm_layer_view(
        self, array: np.ndarray, name: str, types: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """vLLM 0.33.0's per-layer view [B, H, T, 2 * D] (bytes: [B, H, T, 2 * D * word]), any
        strides but a contiguous last dimension: K's D words, then V's, per (block, head, token)."""
        layout = self._layout
        own = _OWN_DTYPES[dtype_name(layout)]
        if array.dtype not in (self._word, np.int8, np.uint8) and not _is_own(array.dtype, own):
            raise ValueError(f"{name}: expected {types} (or its bytes, int8 or uint8); got "
                             f"{array.dtype}")  # fmt: skip
        word = self._word.itemsize
        element = array.itemsize
        blocks = self._num_device_blocks
        expected = [blocks, layout.num_kv_heads, layout.block_size,
                    2 * layout.head_dim * word // element]  # fmt: skip
        if list(array.shape) != expected:
            why = ""
            if blocks and array.shape[0] > blocks and array.shape[0] % blocks == 0:
                why = (f" (kernel blocks of {array.shape[2]} tokens splitting each KV cache "
                       f"block of {layout.block_size} tokens are not served)")  # fmt: skip
            raise ValueError(
                f"{name}: expected shape [num_device_blocks, num_kv_heads, block_size, "
                f"2 * head_dim{'' if element == word else ' * bytes'}] = {expected}; got "
                f"{list(array.shape)}{why}"
            )
        # In elements; a dimension of extent 1 may have any stride, never used.
        placed = zip(expected, array.strides, strict=True)
        strides = [0 if extent == 1 and dim != 3 else stride // element
                   for dim, (extent, stride) in enumerate(placed)]  # fmt: skip
        if strides[3] != 1 or any(stride < 0 for stride in strides):
            raise ValueError(
                f"{name}: expected strides with the last one 1 and none negative (each token's K "
                f"and V words contiguous); got {strides} (in elements)"
            )
        checked_alignment(array, name, word)
        # flags.aligned also covers the strides: stride // element above drops a stray byte.
        if not array.flags.aligned or any(stride * element % word for stride in strides[:3]):
            raise ValueError(
                f"{name}: expected strides that keep words aligned (multiples of {word} bytes); "
                f"got {strides} (in {element}-byte elements)"
            )
        words = array.view(self._word)  # [B, H, T, 2 * D]
        head_dim = layout.head_dim
        return (words[..., :head_dim].transpose(0, 2, 1, 3),
                words[..., head_dim:].transpose(0, 2, 1, 3))  # fmt: skip

    # ---- scheduler side ----

    def lookup(self, hashes: Any) -> int:
        found = 0
        for block_hash in _hashes(hashes):
            block = self._blocks.get(block_hash)
            if block is None or block["state"] != "committed":
                break
            found += 1
        self._events.append(("lookup", found))
        return found

    def plan_load(self, hashes: Any, device_blocks: Any) -> None:
        loads = self._checked_plan(_hashes(hashes), _device_blocks(device_blocks))
        self._add_to_plan(loads, [], "plan_load")

    def plan_store(self, hashes: Any, device_blocks: Any) -> None:
        stores = self._checked_plan(_hashes(hashes), _device_blocks(device_blocks))
        self._add_to_plan([], stores, "plan_store")

    def plan_step(
        self,
        load_hashes: Any,
        load_device_blocks: Any,
        store_hashes: Any,
        store_device_blocks: Any,
    ) -> None:
        """plan_load and plan_store in one call: every argument and limit of both is checked
        before either is planned (SPEC.md §6 rule 11)."""
        values = (
            _hashes(load_hashes, "load_hashes"),
            _device_blocks(load_device_blocks, "load_device_blocks"),
            _hashes(store_hashes, "store_hashes"),
            _device_blocks(store_device_blocks, "store_device_blocks"),
        )
        loads = self._checked_plan(values[0], values[1], "load_")
        stores = self._checked_plan(values[2], values[3], "store_")
        self._add_to_plan(loads, stores, "plan_step", "load_", "store_")

    def build_step(self) -> None:
        if self._phase != "planning":
            self._out_of_order("build_step")
        for block_hash, device in self._planned_loads:
            block = self._blocks.get(block_hash)
            if block is not None and block["state"] == "committed":
                block["pins"] += 1
                self._loads.append(
                    {"hash": block_hash, "device": device, "slot": block["slot"], "lost": False}
                )
                self._events.append(("hit", block_hash))
            else:
                self._events.append(("miss", block_hash))
        self._last_runs = dict.fromkeys(_RUN_KEYS, 0)
        self._count_runs("load", [(entry["slot"], entry["device"]) for entry in self._loads])
        for block_hash, device in self._planned_stores:
            self._stores.append(
                {
                    "hash": block_hash,
                    "device": device,
                    "slot": None,
                    "allocated": False,
                    "dropped": False,
                }
            )
        self._planned_loads = []
        self._planned_stores = []
        self._layers_loaded = 0
        self._layers_saved = 0
        self._phase = "built"

    # ---- worker side ----

    def start_load(self) -> None:
        if self._phase != "built":
            self._out_of_order("start_load")
        if not self._kv:
            raise RuntimeError("start_load: called out of order; expected register_kv_caches first")
        self._phase = "running"
        if self._loads:
            self._issue_load(0, final_attempt=True)

    def wait_for_layer_load(self, layer: int) -> list[int]:
        layer = self._checked_layer(layer)
        if self._phase != "running" or self._layers_loaded != layer or self._layers_saved != layer:
            self._out_of_order(f"wait_for_layer_load({layer})")
        # Layer n + 1 is staged before layer n is completed; with no region free, layer n is
        # completed first (which frees one) and layer n + 1 is tried once more.
        completed = False
        if layer + 1 < self._num_layers and not self._issue_load(layer + 1, final_attempt=False):
            self._complete_load(layer)
            completed = True
            self._issue_load(layer + 1, final_attempt=True)
        if not completed:
            self._complete_load(layer)
        self._layers_loaded += 1
        lost = [entry["device"] for entry in self._loads if entry["lost"]]
        if layer + 1 == self._num_layers:
            for entry in self._loads:
                block = self._blocks[entry["hash"]]
                if entry["lost"]:
                    self._events.append(("load_error", entry["hash"]))
                else:
                    self._stamp(block)
                    self._events.append(("loaded", entry["hash"]))
                block["pins"] -= 1
        return lost

    def save_kv_layer(self, layer: int) -> None:
        layer = self._checked_layer(layer)
        if (
            self._phase != "running"
            or self._layers_loaded != layer + 1
            or self._layers_saved != layer
        ):
            self._out_of_order(f"save_kv_layer({layer})")
        if layer == 0:
            self._allocate_step(self._stores)
        # Layer n is issued before layer n - 1 is completed; with no region free, layer n - 1 is
        # completed first (which frees one) and layer n is tried once more.
        issued = self._issue_store(layer, final_attempt=False)
        if issued == "no_region":
            if self._store_lease is not None:
                self._complete_store(self._store_lease)
                self._store_lease = None
            issued = self._issue_store(layer, final_attempt=True)
        if self._store_lease is not None:
            self._complete_store(self._store_lease)
        self._store_lease = issued
        self._layers_saved += 1

    def wait_for_save(self) -> None:
        all_layers = (
            self._layers_loaded == self._num_layers and self._layers_saved == self._num_layers
        )
        nothing_to_move = (
            self._layers_loaded == 0
            and self._layers_saved == 0
            and not self._loads
            and not self._stores
        )
        if self._phase != "running" or not (all_layers or nothing_to_move):
            self._out_of_order("wait_for_save")
        if self._store_lease is not None:
            self._complete_store(self._store_lease)
            self._store_lease = None
        for entry in self._stores:
            if not entry["allocated"]:
                continue
            block = self._blocks[entry["hash"]]
            if entry["dropped"]:
                del self._blocks[entry["hash"]]
                self._free.append(block["slot"])
                self._free.sort()
                self._events.append(("drop", entry["hash"]))
            else:
                block["state"] = "committed"
                self._stamp(block)
                block["pins"] -= 1
                self._events.append(("commit", entry["hash"]))
        self._loads = []
        self._stores = []
        self._load_leases = []
        self._phase = "planning"

    def inject_fence_fault(self, direction: str, layer: int) -> None:
        if not isinstance(direction, str):
            raise TypeError(f"direction: expected a str; got {type(direction).__name__}")
        if direction not in ("load", "store"):
            raise ValueError(f'direction: expected "load" or "store"; got "{direction}"')
        layer = self._checked_layer(layer)
        key = (direction, layer)
        self._faults[key] = self._faults.get(key, 0) + 1

    def events(self) -> list[tuple[str, int]]:
        taken = self._events
        self._events = []
        return taken

    # ---- checks ----

    def _checked_layer(self, layer: Any) -> int:
        layer = operator.index(layer)
        if not 0 <= layer < self._num_layers:
            raise ValueError(f"layer: expected 0 <= layer < {self._num_layers}; got {layer}")
        return layer

    def _checked_plan(
        self, hash_values: list[int], device_values: list[int], prefix: str = ""
    ) -> list[tuple[int, int]]:
        if len(device_values) != len(hash_values):
            raise ValueError(
                f"{prefix}device_blocks: expected one device block per hash ({len(hash_values)}); "
                f"got {len(device_values)}"
            )
        for index, device in enumerate(device_values):
            if not 0 <= device < self._num_device_blocks:
                raise ValueError(
                    f"{prefix}device_blocks[{index}]: expected 0 <= device block < "
                    f"{self._num_device_blocks}; got {device}"
                )
        return list(zip(hash_values, device_values, strict=True))

    def _add_to_plan(
        self,
        loads: list[tuple[int, int]],
        stores: list[tuple[int, int]],
        call: str,
        load_prefix: str = "",
        store_prefix: str = "",
    ) -> None:
        """Checks hook order, then both plans' limits (SPEC.md §6 rule 9), then plans both."""
        if self._phase != "planning":
            self._out_of_order(call)
        for plan, planned, prefix in ((self._planned_loads, loads, load_prefix),
                                      (self._planned_stores, stores, store_prefix)):  # fmt: skip
            if len(plan) + len(planned) > self._region_blocks:
                raise ValueError(
                    f"{prefix}hashes: a step moves at most region_blocks = {self._region_blocks} "
                    f"blocks each way; {call} would plan {len(plan) + len(planned)}"
                )
            if plan is self._planned_loads:
                self._check_load_targets(planned, prefix)
        self._planned_loads.extend(loads)
        self._planned_stores.extend(stores)

    def _check_load_targets(self, planned: list[tuple[int, int]], prefix: str) -> None:
        """SPEC.md §6 rule 6: a device block receives one hash's bytes per step."""
        target = {device: block_hash for block_hash, device in self._planned_loads}
        for index, (block_hash, device) in enumerate(planned):
            loaded = target.setdefault(device, block_hash)
            if loaded != block_hash:
                raise ValueError(
                    f"{prefix}device_blocks[{index}]: expected a device block no other hash of "
                    f"this step loads into; got {device} (hash {loaded}'s)"
                )

    def _out_of_order(self, call: str) -> None:
        raise RuntimeError(f"{call}: called out of order; expected {self._expected_next()} next")

    def _expected_next(self) -> str:
        if self._phase == "planning":
            return "plan_load, plan_store or build_step"
        if self._phase == "built":
            return "start_load"
        if self._layers_saved == self._num_layers:
            return "wait_for_save"
        if self._layers_loaded == self._layers_saved:
            return f"wait_for_layer_load({self._layers_loaded})"
        return f"save_kv_layer({self._layers_saved})"

    # ---- pool, LRU ----

    def _stamp(self, block: dict[str, Any]) -> None:
        self._clock += 1
        block["last_use"] = self._clock
        # An extent's stamp: the newest its blocks were given (SPEC.md §3).
        self._extent_stamps[block["extent"]] = self._clock

    def _allocate_step(self, entries: list[dict[str, Any]]) -> None:
        """Slots for the step's planned stores (SPEC.md §2, §3): decided one by one in plan
        order (skip, a free slot, evict, refuse), then placed in runs over the free slots."""
        uncounted = len(self._free)
        placed = []
        for entry in entries:
            block_hash = entry["hash"]
            if block_hash in self._blocks:
                continue  # committed or being stored already: nothing to do, no event
            if uncounted:
                uncounted -= 1
            else:
                victims = self._victims()
                if not victims:
                    self._events.append(("refuse", block_hash))
                    continue
                for victim in victims:
                    # Its slot joins the free runs before the step's blocks are placed.
                    self._free.append(self._blocks.pop(victim)["slot"])
                    self._events.append(("evict", victim))
                self._free.sort()
                # The first victim makes room for this store; the others' slots are counted
                # free for the stores after it.
                uncounted += len(victims) - 1
            self._blocks[block_hash] = {
                "slot": None,
                "state": "storing",
                "pins": 1,
                "last_use": 0,
                "extent": -1,
            }
            placed.append(entry)
        if not placed:
            return
        runs = self._take(len(placed))
        # Each run taken is a new extent, numbered in the order runs are placed.
        slots = []
        for start, length in runs:
            slots += [(slot, self._extents) for slot in range(start, start + length)]
            self._extents += 1
        for entry, (slot, extent) in zip(placed, slots, strict=True):
            self._blocks[entry["hash"]]["slot"] = slot
            self._blocks[entry["hash"]]["extent"] = extent
            entry["allocated"] = True
            entry["slot"] = slot
        self._counts["store_steps"] += 1
        self._counts["extents"] += len(runs)
        if len(runs) > 1:
            self._counts["split_steps"] += 1
            self._counts["split_blocks"] += len(placed)
            self._counts["single_slot_blocks"] += sum(1 for _, length in runs if length == 1)
        self._count_runs("store", [(entry["slot"], entry["device"]) for entry in placed])

    def _victims(self) -> list[int]:
        """The blocks one eviction frees, in the order they are evicted (SPEC.md §3): every
        evictable block of the least recently used extent that has one, by slot; empty when
        every committed block is pinned."""
        candidates = [
            (block["last_use"], victim)
            for victim, block in self._blocks.items()
            if block["state"] == "committed" and block["pins"] == 0
        ]
        if not candidates:
            return []
        if "lru_mru_first" in FAULTS:
            return [max(candidates)[1]]
        extents = {self._blocks[victim]["extent"] for _, victim in candidates}
        extent = min(extents, key=self._extent_stamps.__getitem__)
        return [
            victim
            for _, victim in sorted(
                (self._blocks[victim]["slot"], victim)
                for _, victim in candidates
                if self._blocks[victim]["extent"] == extent
            )
        ]

    def _take(self, count: int) -> list[tuple[int, int]]:
        """count free slots as (start, length) runs, in the order blocks fill them (SPEC.md §2):
        the smallest free run that holds every remaining block (lowest start among equals) gives
        its first slots; when none does, the largest (lowest start among equals) is taken whole."""
        taken = []
        while count:
            runs = _runs_of(self._free)
            holding = [(length, start) for start, length in runs if length >= count]
            if holding:
                length, start = min(holding)
            else:
                longest = max(length for _, length in runs)
                if "extent_split_smallest" in FAULTS:
                    longest = min(length for _, length in runs)
                length, start = min((n, s) for s, n in runs if n == longest)
            used = min(length, count)
            taken.append((start, used))
            self._free = [slot for slot in self._free if not start <= slot < start + used]
            count -= used
        return taken

    def _count_runs(self, direction: str, transfers: list[tuple[int, int]]) -> None:
        runs = transfer_runs(transfers)
        self._last_runs[f"last_{direction}_blocks"] = len(transfers)
        self._last_runs[f"last_{direction}_runs"] = len(runs)
        self._last_runs[f"last_{direction}_direct_runs"] = sum(1 for run in runs if run[4])

    # ---- transfers ----

    def _take_fault(self, direction: str, layer: int) -> bool:
        key = (direction, layer)
        if self._faults.get(key, 0) == 0:
            return False
        self._faults[key] -= 1
        return True

    def _region_lost(self, region: int) -> None:
        self._events.append(("quarantine", region))
        if self._staging.all_quarantined() and not self._fatal:
            self._fatal = True
            self._events.append(("fatal", len(self._staging.regions)))

    def _issue_load(self, layer: int, final_attempt: bool) -> bool:
        """Stages one layer of every load not lost. False (nothing done) when no region is free
        and this is not the final attempt; on the final attempt, or with every region
        quarantined, the transfer is not made and its blocks are lost."""
        entries = [index for index, entry in enumerate(self._loads) if not entry["lost"]]
        if not entries:
            return True
        status, lease = self._staging.prepare()
        if status == "no_region" and not final_attempt:
            return False
        if status != "ok":
            for index in entries:
                self._loads[index]["lost"] = True
            return True
        transfers = [(self._loads[i]["slot"], self._loads[i]["device"]) for i in entries]
        self._staging.bind(lease, transfers)
        size = self._layer_bytes
        kv = self._kv[layer]

        def copies(transfers: list[tuple[int, int]]) -> None:
            for slot, device in transfers:
                stored = self._slots[slot][layer * size : (layer + 1) * size]
                k, v = decode_layer(self._layout, self._mode, np.frombuffer(stored, np.uint8))
                kv[0][device] = k
                kv[1][device] = v

        fence_ok = not self._take_fault("load", layer)
        self._staging.transfer(lease, fence_ok, copies)
        self._load_leases.append({"layer": layer, "lease": lease, "entries": entries})
        return True

    def _complete_load(self, layer: int) -> None:
        for in_flight in self._load_leases:
            if in_flight["layer"] != layer:
                continue
            self._load_leases.remove(in_flight)
            status = self._staging.complete(in_flight["lease"])
            if status == "lost":
                self._region_lost(in_flight["lease"][0])
                for index in in_flight["entries"]:
                    self._loads[index]["lost"] = True
            return

    def _issue_store(self, layer: int, final_attempt: bool) -> Any:
        """Stages one layer of every allocated store not dropped: the lease in flight, None when
        nothing was issued, or "no_region" (nothing done) when no region is free and this is not
        the final attempt. On the final attempt, or with every region quarantined, the transfer
        is not made and its blocks are dropped."""
        entries = [
            index
            for index, entry in enumerate(self._stores)
            if entry["allocated"] and not entry["dropped"]
        ]
        if not entries:
            return None
        status, lease = self._staging.prepare()
        if status == "no_region" and not final_attempt:
            return "no_region"
        if status != "ok":
            for index in entries:
                self._stores[index]["dropped"] = True
            return None
        transfers = [(self._stores[i]["slot"], self._stores[i]["device"]) for i in entries]
        self._staging.bind(lease, transfers)
        size = self._layer_bytes
        kv = self._kv[layer]

        def copies(transfers: list[tuple[int, int]]) -> None:
            # Straight into the slots: a store whose fence is lost is dropped, and a dropped
            # slot is freed without being read.
            for slot, device in transfers:
                k, v = (np.ascontiguousarray(kv[0][device]), np.ascontiguousarray(kv[1][device]))
                stored = encode_layer(self._layout, self._mode, k, v)
                self._slots[slot][layer * size : (layer + 1) * size] = stored.tobytes()

        fence_ok = not self._take_fault("store", layer)
        self._staging.transfer(lease, fence_ok, copies)
        return {"layer": layer, "lease": lease, "entries": entries}

    def _complete_store(self, in_flight: dict[str, Any]) -> None:
        status = self._staging.complete(in_flight["lease"])
        if status == "lost":
            self._region_lost(in_flight["lease"][0])
            for index in in_flight["entries"]:
                self._stores[index]["dropped"] = True
