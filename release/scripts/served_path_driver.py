"""Drives a vLLM KV connector through vLLM's hooks and counts first-party Python frames per step.

Run by the served-path gate (release/gates/served_path.py) with an interpreter that has vLLM
(3.11 or newer: frames are counted with ``sys.monitoring``, or on 3.11 with the profile hooks of
``sys`` and ``threading``), as a script::

    python -I served_path_driver.py --report REPORT --site SITE --reference DIR [--layers 4]
        [--steps 6]

SITE holds the installed activekv wheel; DIR is the checkout's ``reference/`` (the Python
reference connector, never shipped). Both connectors run the same way: a real vLLM ``Scheduler``
(CPU device, a
model folder holding only ``config.json``) calls the scheduler half; the worker half gets vLLM's
calls in the order of ``KVConnectorModelRunnerMixin._get_kv_connector_output`` and of the
attention layers' ``maybe_transfer_kv_layer`` (wait_for_layer_load, then save_kv_layer, per
layer). A second request shares the first's prompt, so later steps load what earlier ones stored.

Writes one JSON object to REPORT, whole or not at all, once both connectors ran (never to stdout,
which vLLM, its plugins and the shim may print to): per connector, per step, the first-party frames
and code objects, the hooks called, the plans, and the engine's event counts. Standard library,
vLLM and torch only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import threading
import uuid
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

TOOL_ID = 4  # sys.monitoring.PROFILER_ID's neighbour: free in a plain interpreter
HOOKS = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "register_kv_caches",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_block_ids_with_load_errors",
)
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float16",
}


class FrameCounter:
    """sys.monitoring PY_START/PY_RETURN of code under ``roots``: frames, code objects, depth.
    Python 3.11 has no sys.monitoring: there the profile hook's call and return events, which it
    sends for Python frames only (a frame left by an exception returns too), count the same."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = tuple(str(root.resolve()) + os.sep for root in roots)
        self.frames = 0
        self.codes: Counter[str] = Counter()
        self.depth = 0
        self.max_depth = 0

    def _ours(self, code: CodeType) -> bool:
        return code.co_filename.startswith(self.roots)

    def start(self, code: CodeType, offset: int) -> Any:
        if not self._ours(code):
            return sys.monitoring.DISABLE
        self.frames += 1
        self.codes[f"{Path(code.co_filename).name}:{code.co_firstlineno}:{code.co_qualname}"] += 1
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        return None

    def end(self, code: CodeType, offset: int, value: object) -> Any:
        if not self._ours(code):
            return sys.monitoring.DISABLE
        self.depth -= 1
        return None

    def unwind(self, code: CodeType, offset: int, exception: BaseException) -> None:
        if self._ours(code):  # PY_UNWIND cannot be disabled per code location
            self.depth -= 1

    def take(self) -> dict[str, Any]:
        taken = {"frames": self.frames, "codes": dict(self.codes), "max_depth": self.max_depth}
        self.frames, self.codes, self.max_depth = 0, Counter(), self.depth
        return taken

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and self._ours(frame.f_code):
            self.start(frame.f_code, 0)
        elif event == "return" and self._ours(frame.f_code):
            self.depth -= 1

    def __enter__(self) -> FrameCounter:
        if not hasattr(sys, "monitoring"):  # Python 3.11
            threading.setprofile(self.profile)  # threads started from here on
            sys.setprofile(self.profile)
            return self
        events = sys.monitoring.events
        sys.monitoring.use_tool_id(TOOL_ID, "activekv-served-path")
        sys.monitoring.register_callback(TOOL_ID, events.PY_START, self.start)
        sys.monitoring.register_callback(TOOL_ID, events.PY_RETURN, self.end)
        sys.monitoring.register_callback(TOOL_ID, events.PY_UNWIND, self.unwind)
        sys.monitoring.set_events(TOOL_ID, events.PY_START | events.PY_RETURN | events.PY_UNWIND)
        return self

    def __exit__(self, *exc: object) -> None:
        if not hasattr(sys, "monitoring"):
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]  # None removes the hook
            return
        sys.monitoring.set_events(TOOL_ID, 0)
        sys.monitoring.free_tool_id(TOOL_ID)


class HookLog:
    """Counts the connector's hooks as vLLM calls them (wrapping the instance, not the class)."""

    def __init__(self, connector: Any) -> None:
        self.calls: Counter[str] = Counter()
        for name in HOOKS:
            bound = getattr(connector, name)
            setattr(connector, name, self._counted(name, bound))

    def _counted(self, name: str, bound: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return bound(*args, **kwargs)

        return call

    def take(self) -> dict[str, int]:
        taken, self.calls = dict(self.calls), Counter()
        return taken


def block_digest(kv_caches: dict[str, Any], names: list[str], block: int) -> str:
    """sha256 of one device block's K and V bytes in every layer ([B, H, N, 2D] views)."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(kv_caches[name][block].contiguous().view(-1).view(torch_uint8()).numpy())
    return digest.hexdigest()


def torch_uint8() -> Any:
    import torch

    return torch.uint8


def build_configs(
    model_dir: Path, connector: str, module_path: str | None, layers: int, *,
    kv_layout: str = "LBNHC", dtype: str = "float16", block_size: int = 16, num_blocks: int = 64,
    num_kv_heads: int = MODEL_CONFIG["num_key_value_heads"],
    head_dim: int = MODEL_CONFIG["head_dim"],
    extra: dict[str, Any] | None = None, tensor_parallel_size: int = 1,
) -> Any:  # fmt: skip
    """vLLM's configs as its engine core makes them for a model of `layers` attention layers: the
    KV cache config planned by vLLM (`get_kv_cache_config_from_groups`) for `kv_layout`, so that
    `real_kv_caches` gets from `allocate_kv_cache` exactly the tensors a worker registers."""
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    try:  # vLLM 0.33 moved it out of kv_cache_utils
        from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
    except ImportError:  # vLLM 0.32
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    (model_dir / "config.json").write_text(
        json.dumps({**MODEL_CONFIG, "num_hidden_layers": layers, "torch_dtype": dtype})
    )
    model_config = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, max_model_len=512
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=512,
            max_model_len=512,
            is_encoder_decoder=False,
            disable_hybrid_kv_cache_manager=True,
        ),
        device_config=DeviceConfig("cpu"),
        parallel_config=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector,
            kv_connector_module_path=module_path,
            kv_role="kv_both",
            # Unique per call: the workers' block index is named by it, host-wide.
            engine_id=f"served-path-{kv_layout}-{dtype}-{block_size}-{num_kv_heads}-{uuid.uuid4().hex}",
            kv_connector_extra_config=extra
            if extra is not None
            else {"cpu_bytes": 1 << 22, "num_regions": 4, "region_blocks": 16},
        ),
    )
    vllm_config.cache_config.kv_cache_layout = kv_layout
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_size=head_dim,
        dtype=getattr(torch, dtype),
    )
    kv_cache_config = get_kv_cache_config_from_groups(
        vllm_config, [KVCacheGroupSpec(names, spec)], num_blocks * layers * spec.page_size_bytes
    )
    vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    return vllm_config, kv_cache_config, names, spec, kv_cache_config.num_blocks


def real_kv_caches(vllm_config: Any, kv_cache_config: Any) -> dict[str, Any]:
    """The KV caches a CPU worker of vLLM allocates and registers: one backing allocation, a
    [B, H, N, 2D] view per layer placed by the config's KVCacheLayout."""
    import torch
    from vllm.v1.worker.utils import allocate_kv_cache

    layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    return allocate_kv_cache(kv_cache_config, torch.device("cpu"), layout)


def worker_step(worker: Any, output: Any, kv_caches: dict[str, Any], names: list[str]) -> set[int]:
    """The worker half's calls for one scheduler step, in the order KVConnectorModelRunnerMixin
    and the attention layers make them; the device blocks it reports as failed loads."""
    from vllm.forward_context import ForwardContext

    worker.bind_connector_metadata(output.kv_connector_metadata)
    context = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
    if output.has_sync_kv_loads:
        worker.start_load_kv(context)
    if output.total_num_scheduled_tokens > 0:
        for name in names:
            worker.wait_for_layer_load(name)
            worker.save_kv_layer(name, kv_caches[name], None)
    if not output.has_sync_kv_loads:
        worker.start_load_kv(context)
    worker.wait_for_save()
    worker.get_transfer_results(output.finished_req_ids)
    invalid = worker.get_block_ids_with_load_errors()
    worker.clear_connector_metadata()
    return invalid


def runner_output(output: Any, invalid: set[int]) -> Any:
    """What the model runner returns for `output`: one sampled token per request, and the
    connector's failed loads."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    req_ids = list(output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[11] for _ in req_ids],
        kv_connector_output=KVConnectorOutput(invalid_block_ids=invalid),
    )


def drive(
    connector_name: str, module_path: str | None, roots: list[Path], layers: int, steps: int
) -> dict[str, Any]:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    with tempfile.TemporaryDirectory() as model_dir:
        vllm_config, kv_cache_config, names, spec, _ = build_configs(
            Path(model_dir), connector_name, module_path, layers
        )
        scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=spec.block_size,
        )
        worker = KVConnectorFactory.create_connector(
            vllm_config, KVConnectorRole.WORKER, kv_cache_config
        )
    assert scheduler.connector is not None
    scheduler_hooks = HookLog(scheduler.connector)
    worker_hooks = HookLog(worker)
    generator = torch.Generator().manual_seed(7)
    kv_caches = real_kv_caches(vllm_config, kv_cache_config)
    for name in names:  # random finite float16 bits, written through each strided view
        view = kv_caches[name]
        view.copy_(torch.randint(0, 2**15, view.shape, dtype=torch.int16, generator=generator)
                   .view(view.dtype))  # fmt: skip
    init_none_hash(sha256)
    hasher = get_request_block_hasher(spec.block_size, sha256)
    prompt = [(7 * i + 3) % 500 for i in range(5 * spec.block_size + 3)]
    counter = FrameCounter(roots)
    stored: dict[int, str] = {}
    records: list[dict[str, Any]] = []
    with counter:
        worker.register_kv_caches(kv_caches)
        counter.take(), worker_hooks.take()
        for step in range(steps):
            # A request arrives every other step with the same prompt: the first one's blocks
            # are stored, later ones find them in the host pool and load them.
            if step % 2 == 0:
                scheduler.add_request(
                    Request(
                        request_id=f"r{step}",
                        prompt_token_ids=list(prompt),
                        sampling_params=SamplingParams(max_tokens=2),
                        pooling_params=None,
                        block_hasher=hasher,
                    )
                )
            output = scheduler.schedule()
            metadata = output.kv_connector_metadata
            plan = getattr(metadata, "plan", metadata)  # ActiveKVMetadata carries a StepPlan
            # New blocks start zeroed (vLLM's new_block_ids_to_zero), so a load that moves nothing
            # cannot pass for one that did.
            for _, block in plan.loads:
                for name in names:
                    kv_caches[name][block].zero_()
            invalid = worker_step(worker, output, kv_caches, names)
            # What moved: each stored block's bytes, and each loaded block against them.
            for key, block in plan.stores:
                stored[key] = block_digest(kv_caches, names, block)
            verified = [
                block_digest(kv_caches, names, block) == stored.get(key)
                for key, block in plan.loads
                if block not in invalid
            ]
            scheduler.update_from_output(output, runner_output(output, invalid))
            records.append(
                {
                    "step": step,
                    "scheduled_tokens": output.total_num_scheduled_tokens,
                    "sync_loads": bool(output.has_sync_kv_loads),
                    "loads": [list(x) for x in plan.loads],
                    "stores": [list(x) for x in plan.stores],
                    "load_errors": sorted(invalid),
                    "loads_verified": sum(verified),
                    "load_mismatches": len(verified) - sum(verified),
                    "hooks": {**scheduler_hooks.take(), **worker_hooks.take()},
                    **counter.take(),
                }
            )
    events = {}
    for half in (scheduler.connector, worker):
        counts = getattr(half, "event_counts", None) or getattr(half, "_core", None)
        counts = counts.event_counts if hasattr(counts, "event_counts") else counts
        for kind, count in dict(counts or {}).items():
            events[kind] = events.get(kind, 0) + count
    return {"connector": type(worker).__module__ + "." + type(worker).__qualname__,
            "steps": records, "events": events}  # fmt: skip


def write_report(report: Path, result: dict[str, Any]) -> None:
    """Writes `result` to `report` whole or not at all (a partial file, then a rename)."""
    partial = report.with_name(report.name + ".partial")
    partial.write_text(json.dumps(result), encoding="utf-8")
    os.replace(partial, report)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--site", type=Path, required=True)
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # before vLLM is imported: no GPU here
    sys.path[:0] = [str(args.site), str(args.reference.parent)]
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # our entry point registers ActiveKVConnector
    import vllm
    from activekv import _vllm

    result = {
        "vllm_version": vllm.__version__,
        "supported_vllm": _vllm.SUPPORTED_VLLM,
        "engine": drive(
            "ActiveKVConnector", None, [args.site / "activekv"], args.layers, args.steps
        ),
        "reference": drive(
            "ReferenceConnector",
            "reference.vllm_connector",
            [args.reference],
            args.layers,
            args.steps,
        ),
    }
    write_report(args.report, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
