"""The vLLM connector as it was in Python: the oracle of bindings/vllm_connector.cpp (not shipped).

Same decisions as the native ConnectorCore (block keys, offered blocks, store plans, lazy step
start), on the Python reference engine. The served-path gate drives it through vLLM's hooks beside
the shipped shim and counts the first-party Python frames each runs: this is the "before".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

from .engine import Engine

FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211
_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


def block_key(block_hash: bytes | int) -> int:
    """FNV-1a of vLLM's hash bytes (integers are used as they are), as the native core does."""
    if isinstance(block_hash, int):
        return block_hash
    key = FNV_OFFSET
    for byte in block_hash:
        key = ((key ^ byte) * FNV_PRIME) % 2**64
    return key


@dataclass
class ReferencePlan(KVConnectorMetadata):
    loads: list[tuple[int, int]] = field(default_factory=list)
    stores: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Tracked:
    request: Any
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    local_blocks: int = 0
    hit_blocks: int = 0
    load_blocks: int = 0
    stored_blocks: int = 0


_ENGINES: dict[str, Engine] = {}
# What each engine's worker half published (engine/offload/SPEC.md §9: commits add, evictions
# remove, drained after each step); the scheduler half looks blocks up here, as the native one
# reads the shared block index, never the worker's engine.
_PUBLISHED: dict[str, set[int]] = {}


class ReferenceConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        (group,) = kv_cache_config.kv_cache_groups
        spec = group.kv_cache_spec
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self._layer_names = list(group.layer_names)
        self._block_size = spec.block_size
        self._region_blocks = int(extra.get("region_blocks", 64))
        layout = SimpleNamespace(
            num_layers=len(self._layer_names),
            block_size=spec.block_size,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_size,
            dtype=_DTYPES[str(spec.dtype)],
        )
        engine_id = str(vllm_config.kv_transfer_config.engine_id) + "/reference"
        if engine_id not in _ENGINES:
            _ENGINES[engine_id] = Engine(
                layout,
                extra.get("mode", "exact"),
                int(extra.get("cpu_bytes", 1 << 30)),
                int(extra.get("num_regions", 4)),
                self._region_blocks,
                kv_cache_config.num_blocks,
            )
        self._engine = _ENGINES[engine_id]
        self._published = _PUBLISHED.setdefault(engine_id, set())
        self._requests: dict[str, Tracked] = {}
        self._plan = ReferencePlan()
        self._offered = 0
        self._layer_index: dict[str, int] = {}
        self._running = False
        self._load_errors: set[int] = set()
        self.event_counts: dict[str, int] = {}

    # ---- scheduler half ----

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        keys = [block_key(h) for h in request.block_hashes]
        keys = keys[: max(request.num_tokens - 1, 0) // self._block_size]
        hits = next((i for i, key in enumerate(keys) if key not in self._published), len(keys))
        tracked = self._requests.setdefault(request.request_id, Tracked(request))
        self._offered -= tracked.load_blocks
        tracked.request = request
        tracked.local_blocks = num_computed_tokens // self._block_size
        tracked.hit_blocks = hits
        room = max(self._region_blocks - len(self._plan.loads) - self._offered, 0)
        tracked.load_blocks = min(max(hits - tracked.local_blocks, 0), room)
        self._offered += tracked.load_blocks
        return tracked.load_blocks * self._block_size, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        tracked = self._requests.get(request.request_id)
        if tracked is None:
            return
        load_blocks = min(max(num_external_tokens, 0) // self._block_size, tracked.load_blocks)
        self._offered -= tracked.load_blocks
        tracked.load_blocks = 0
        known = (
            tracked.local_blocks + load_blocks
            if load_blocks
            else min(tracked.hit_blocks, tracked.local_blocks)
        )
        tracked.stored_blocks = max(tracked.stored_blocks, known)
        if not load_blocks:
            return
        keys = [block_key(h) for h in request.block_hashes]
        block_ids = list(blocks.get_block_ids()[0])
        for index in range(tracked.local_blocks, tracked.local_blocks + load_blocks):
            self._plan.loads.append((keys[index], block_ids[index]))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        for new in scheduler_output.scheduled_new_reqs:
            if tracked := self._requests.get(new.req_id):
                tracked.block_ids = list(new.block_ids[0])
                tracked.num_computed_tokens = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            tracked = self._requests.get(req_id)
            if tracked is None:
                continue
            groups = cached.new_block_ids[index]
            if groups is not None:
                if req_id in cached.resumed_req_ids:
                    tracked.block_ids = []
                tracked.block_ids += list(groups[0])
            tracked.num_computed_tokens = cached.num_computed_tokens[index]
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            tracked = self._requests.get(req_id)
            if tracked is None:
                continue
            keys = [block_key(h) for h in tracked.request.block_hashes]
            full = min(
                (tracked.num_computed_tokens + count) // self._block_size,
                len(keys),
                len(tracked.block_ids),
            )
            while tracked.stored_blocks < full and len(self._plan.stores) < self._region_blocks:
                index = tracked.stored_blocks
                self._plan.stores.append((keys[index], tracked.block_ids[index]))
                tracked.stored_blocks += 1
        for req_id in scheduler_output.finished_req_ids:
            self._requests.pop(req_id, None)
        for tracked in self._requests.values():  # offers not taken up this step lapse
            tracked.load_blocks = 0
        self._offered = 0
        plan, self._plan = self._plan, ReferencePlan()
        return plan

    # ---- worker half ----

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        import torch

        words = torch.uint32 if self._engine._word == np.uint32 else torch.uint16
        layers = [kv_caches[name].view(words).numpy() for name in self._layer_names]
        self._engine.register_kv_caches(layers)
        self._layer_index = {name: index for index, name in enumerate(self._layer_names)}

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._begin_step()

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._begin_step()
        lost = self._engine.wait_for_layer_load(self._layer_index[layer_name])
        self._load_errors.update(lost)

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        self._begin_step()
        self._engine.save_kv_layer(self._layer_index[layer_name])

    def wait_for_save(self) -> None:
        self._begin_step()
        self._engine.wait_for_save()
        self._running = False
        self._drain_events()

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def _begin_step(self) -> None:
        if self._running:
            return
        # Before planning: a hook refused here leaves the engine as it was.
        if not self._engine._kv:
            raise RuntimeError("called out of order; expected register_kv_caches first")
        plan = self._get_connector_metadata()
        assert isinstance(plan, ReferencePlan)
        # One call: a step refused for a bad store plans none of its loads either.
        loads, stores = plan.loads, plan.stores
        self._engine.plan_step(
            [k for k, _ in loads],
            [b for _, b in loads],
            [k for k, _ in stores],
            [b for _, b in stores],
        )
        self._engine.build_step()
        self._engine.start_load()
        self._running = True

    def _drain_events(self) -> None:
        for kind, value in self._engine.events():
            self.event_counts[kind] = self.event_counts.get(kind, 0) + 1
            if kind == "commit":
                self._published.add(value)
            elif kind == "evict":
                self._published.discard(value)
