"""The connector on the KV caches vLLM 0.33.0 really allocates: its KV cache config planned by
vLLM for each KVCacheLayout, the per-layer views of `allocate_kv_cache`, the real Scheduler.

A request's full blocks are stored, every device block is then overwritten, and a second request
with the same prompt loads them back: each loaded block must hold the first request's bytes
(exact), or within the codec's bound per (token, head) row (int8, fp8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from release.scripts.served_path_driver import (
    build_configs,
    real_kv_caches,
    runner_output,
    worker_step,
)

LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
# (dtype, block_size, num_kv_heads, head_dim)
SPECS = (
    ("float16", 16, 1, 64),
    ("bfloat16", 32, 8, 64),
    ("float32", 16, 2, 32),
    ("bfloat16", 16, 4, 128),
)
LAYERS = 2


class Rig:
    """vLLM's Scheduler with ActiveKVConnector, and the connector's worker half on the tensors
    `allocate_kv_cache` makes; steps run as KVConnectorModelRunnerMixin runs them."""

    def __init__(
        self, folder: Path, layout: str, spec: tuple[str, int, int, int], mode: str, *,
        num_blocks: int = 24, step_tokens: int | None = None,
    ) -> None:  # fmt: skip
        import torch
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
        from vllm.plugins import load_general_plugins
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        load_general_plugins()
        dtype, block_size, heads, head_dim = spec
        extra = {"mode": mode, "cpu_bytes": 1 << 24, "num_regions": 4, "region_blocks": 16}
        self.vllm_config, kv_cache_config, self.names, self.spec, _ = build_configs(
            folder, "ActiveKVConnector", None, LAYERS, kv_layout=layout, dtype=dtype,
            block_size=block_size, num_kv_heads=heads, head_dim=head_dim, num_blocks=num_blocks,
            extra=extra,
        )  # fmt: skip
        if step_tokens is not None:  # chunked prefill: a prompt takes several steps
            self.vllm_config.scheduler_config.max_num_batched_tokens = step_tokens
        self.scheduler = Scheduler(
            vllm_config=self.vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=block_size,
        )
        self.worker = KVConnectorFactory.create_connector(
            self.vllm_config, KVConnectorRole.WORKER, kv_cache_config
        )
        self.kv = real_kv_caches(self.vllm_config, kv_cache_config)
        self.generator = torch.Generator().manual_seed(3)
        self.randomize()
        self.worker.register_kv_caches(self.kv)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(block_size, sha256)

    def randomize(self) -> None:
        """Every device block of every layer: new random values of the layer's dtype."""
        import torch

        for view in self.kv.values():
            view.copy_(torch.randn(view.shape, generator=self.generator).to(view.dtype))

    def block(self, block: int) -> list[Any]:
        """One device block of every layer, [H, N, 2D], copied out."""
        return [self.kv[name][block].clone() for name in self.names]

    def add(self, request_id: str, prompt: list[int], max_tokens: int = 1) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        self.scheduler.add_request(Request(
            request_id=request_id, prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            pooling_params=None, block_hasher=self.hasher,
        ))  # fmt: skip

    def step(self, before_load: Any = None) -> tuple[Any, set[int]]:
        """One scheduler step, the worker's hooks in the model runner's order; its plan and the
        blocks reported as failed loads. `before_load(core)` runs before the worker's hooks."""
        output = self.scheduler.schedule()
        if before_load is not None:
            before_load(self.worker._core)
        invalid = worker_step(self.worker, output, self.kv, self.names)
        self.scheduler.update_from_output(output, runner_output(output, invalid))
        return output.kv_connector_metadata.plan, invalid

    def serve(self, request_id: str, prompt: list[int]) -> list[Any]:
        """Runs `request_id` to its end; the connector plans of its steps."""
        self.add(request_id, prompt)
        plans = []
        while self.scheduler.has_requests():
            plan, invalid = self.step()
            assert not invalid
            plans.append(plan)
        return plans


def _round_trip(tmp_path: Path, layout: str, spec: tuple[str, int, int, int], mode: str):
    """(stored bytes by key, loaded bytes by key) of a prompt of three full blocks."""
    rig = Rig(tmp_path, layout, spec, mode)
    block_size = spec[1]
    prompt = [(5 * i + 1) % 500 for i in range(3 * block_size + 1)]
    stored = {}
    for plan in rig.serve("first", prompt):
        for key, block in plan.stores:
            stored[key] = rig.block(block)
    assert len(stored) == 3
    rig.randomize()  # the device KV is overwritten: what comes back was loaded
    loaded = {}
    for plan in rig.serve("second", prompt):
        assert not plan.stores or set(dict(plan.stores)).isdisjoint(stored)
        for key, block in plan.loads:
            loaded[key] = rig.block(block)
    return stored, loaded


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_round_trips_every_byte(
    activekv_site: Path, tmp_path: Path, layout: str, spec: tuple[str, int, int, int]
) -> None:
    import torch

    stored, loaded = _round_trip(tmp_path, layout, spec, "exact")
    assert set(loaded) == set(stored)
    for key, layers in loaded.items():
        for got, want in zip(layers, stored[key], strict=True):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), key


@pytest.mark.parametrize("mode", ["int8", "fp8"])
@pytest.mark.parametrize("spec", SPECS[:2], ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
def test_compressed_modes_keep_each_row_within_its_scale(
    activekv_site: Path, tmp_path: Path, layout: str, spec: tuple[str, int, int, int], mode: str
) -> None:
    """Each (token, head) row of K and of V has its own scale: its error stays within the
    codec's step for that row (int8: half of amax / 127; fp8 e4m3: 2**-4 relative, plus the
    smallest subnormal step)."""
    import torch

    stored, loaded = _round_trip(tmp_path, layout, spec, mode)
    head_dim = spec[3]
    assert set(loaded) == set(stored)
    for key, layers in loaded.items():
        for got, want in zip(layers, stored[key], strict=True):
            got, want = got.float(), want.float()
            rows = want.reshape(-1, head_dim)  # every (head, token, K or V) row
            error = (got.reshape(-1, head_dim) - rows).abs()
            amax = rows.abs().amax(dim=1, keepdim=True)
            if mode == "int8":
                bound = amax / 127 / 2 * 1.01 + 1e-6
            else:
                bound = rows.abs() * 2**-4 + amax / 448 * 2**-9 + 1e-6
            assert (error <= bound + rows.abs() * 2**-8).all(), key  # + the dtype rounding back
            assert torch.count_nonzero(error) > 0 or mode == "exact"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_test_layouts_are_vllms(activekv_site: Path, tmp_path: Path, layout: str) -> None:
    """tests/fixtures_kv.py places KV caches as vLLM does, for the tests that run without vLLM:
    the same per-layer view strides and the same distance between layers as allocate_kv_cache."""
    import numpy as np
    import torch
    from fixtures_kv import layer_views

    dtype, block_size, heads, head_dim = SPECS[1]
    vllm_config, kv_cache_config, names, _, num_blocks = build_configs(
        tmp_path, "ActiveKVConnector", None, LAYERS, kv_layout=layout, dtype=dtype,
        block_size=block_size, num_kv_heads=heads, head_dim=head_dim, num_blocks=24,
    )  # fmt: skip
    allocated = real_kv_caches(vllm_config, kv_cache_config)  # one backing allocation
    real = [allocated[name] for name in names]
    ours = layer_views(layout, LAYERS, num_blocks, heads, block_size, head_dim, np.uint16)
    word = torch.finfo(real[0].dtype).bits // 8
    assert [tuple(view.shape) for view in real] == [view.shape for view in ours]
    assert [tuple(s * word for s in view.stride()) for view in real] == [v.strides for v in ours]
    assert real[1].data_ptr() - real[0].data_ptr() == ours[1].ctypes.data - ours[0].ctypes.data
