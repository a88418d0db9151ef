"""One tensor-parallel worker of vLLM's multiprocess executor, in its own process: its rank set
as vLLM's WorkerBase sets it, its own KV caches from `allocate_kv_cache` (its shard: random
values of its own), ActiveKV's worker half registered on them. It runs the steps the parent's
Scheduler sends, as the model runner does, and answers with the bytes of every block the step
stored or loaded."""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

from release.scripts.served_path_driver import real_kv_caches, worker_step


def block_bytes(kv: dict[str, Any], names: list[str], block: int) -> bytes:
    """One device block of every layer, as bytes."""
    import torch

    return b"".join(kv[n][block].contiguous().view(torch.uint8).numpy().tobytes() for n in names)


def serve_rank(
    connection: Connection, vllm_config: Any, kv_cache_config: Any, rank: int, names: list[str]
) -> None:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    vllm_config.parallel_config.rank = rank  # vllm/v1/worker/worker_base.py:86
    worker = KVConnectorFactory.create_connector(
        vllm_config, KVConnectorRole.WORKER, kv_cache_config
    )
    kv = real_kv_caches(vllm_config, kv_cache_config)
    generator = torch.Generator().manual_seed(1000 + rank)

    def randomize() -> None:
        for view in kv.values():
            view.copy_(torch.randn(view.shape, generator=generator).to(view.dtype))

    randomize()
    worker.register_kv_caches(kv)
    connection.send("ready")
    while (message := connection.recv()) is not None:
        if message == "randomize":
            randomize()
            connection.send("randomized")
            continue
        invalid = worker_step(worker, message, kv, names)
        plan = message.kv_connector_metadata.plan
        stored = {key: block_bytes(kv, names, block) for key, block in plan.stores}
        loaded = {key: block_bytes(kv, names, block) for key, block in plan.loads}
        connection.send((invalid, stored, loaded))
