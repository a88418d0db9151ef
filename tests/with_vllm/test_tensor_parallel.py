"""Tensor-parallel workers in their own processes, as vLLM's multiprocess executor runs them
(tensor_parallel_size = 2, simulated on the CPU): the real Scheduler with ActiveKV's scheduler
half here, each worker in a spawned process with its own KV shard and pool. The scheduler sees
hits only for blocks every live worker holds (engine/offload/SPEC.md §9), each worker loads its
own shard's bytes back, and a worker that dies takes its blocks out of the hits while the index
stays usable for the worker that replaces it."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from tp_worker import serve_rank

from release.scripts.served_path_driver import build_configs, runner_output

BLOCK_SIZE = 16
LAYERS = 2


class Worker:
    """One rank's process and the pipe to it."""

    def __init__(self, configs: tuple[Any, Any, list[str]], rank: int) -> None:
        context = multiprocessing.get_context("spawn")  # as vLLM's executor starts its workers
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=serve_rank, args=(child, *configs[:2], rank, configs[2])
        )
        self.process.start()
        assert self.connection.recv() == "ready"

    def step(self, output: Any) -> tuple[set[int], dict[int, bytes], dict[int, bytes]]:
        self.connection.send(output)
        return self.connection.recv()

    def randomize(self) -> None:
        self.connection.send("randomize")
        assert self.connection.recv() == "randomized"

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: nothing of the worker's runs, its lock goes with it
        self.process.join()

    def stop(self) -> None:
        if self.process.is_alive():
            self.connection.send(None)
            self.process.join(30)


class Cluster:
    def __init__(self, folder: Path) -> None:
        from vllm.plugins import load_general_plugins
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        load_general_plugins()
        extra = {"mode": "exact", "cpu_bytes": 1 << 22, "num_regions": 4, "region_blocks": 16}
        vllm_config, kv_cache_config, names, _, _ = build_configs(
            folder, "ActiveKVConnector", None, LAYERS, block_size=BLOCK_SIZE, num_kv_heads=2,
            head_dim=64, num_blocks=32, extra=extra, tensor_parallel_size=2,
        )  # fmt: skip
        self.configs = (vllm_config, kv_cache_config, names)
        self.scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK_SIZE,
        )
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.workers: list[Worker | None] = [Worker(self.configs, rank) for rank in (0, 1)]

    def serve(self, request_id: str, prompt: list[int]) -> list[dict[str, Any]]:
        """Runs one request to its end; per step, its plan and what each live worker reported."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        self.scheduler.add_request(Request(
            request_id=request_id, prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=1, ignore_eos=True),
            pooling_params=None, block_hasher=self.hasher,
        ))  # fmt: skip
        steps = []
        while self.scheduler.has_requests():
            output = self.scheduler.schedule()
            reports = {rank: w.step(output) for rank, w in enumerate(self.workers) if w is not None}
            invalid = set().union(*(report[0] for report in reports.values()))
            self.scheduler.update_from_output(output, runner_output(output, invalid))
            steps.append({"plan": output.kv_connector_metadata.plan, "reports": reports})
        return steps

    def stop(self) -> None:
        for worker in self.workers:
            if worker is not None:
                worker.stop()


def _merged(steps: list[dict[str, Any]], rank: int, field: int) -> dict[int, bytes]:
    merged: dict[int, bytes] = {}
    for step in steps:
        if rank in step["reports"]:
            merged.update(step["reports"][rank][field])
    return merged


def _loads(steps: list[dict[str, Any]]) -> int:
    return sum(len(step["plan"].loads) for step in steps)


def test_tensor_parallel_workers_share_hits_and_load_their_own_shards(
    activekv_site: Path, tmp_path: Path
) -> None:
    cluster = Cluster(tmp_path)
    prompt = [(3 * i + 2) % 500 for i in range(3 * BLOCK_SIZE + 1)]
    try:
        first = cluster.serve("first", prompt)
        stored = [_merged(first, rank, 1) for rank in (0, 1)]
        assert len(stored[0]) == len(stored[1]) == 3
        assert all(stored[0][key] != stored[1][key] for key in stored[0])  # two shards

        for worker in cluster.workers:
            assert worker is not None
            worker.randomize()  # the device KV is overwritten: what comes back was loaded
        second = cluster.serve("second", prompt)
        assert _loads(second) == 3, "the scheduler sees the blocks both workers hold"
        for rank in (0, 1):
            assert _merged(second, rank, 2) == stored[rank], f"rank {rank} loads its own shard"
            assert not any(step["reports"][rank][0] for step in second)

        dead = cluster.workers[1]
        assert dead is not None
        dead.kill()
        cluster.workers[1] = None
        third = cluster.serve("third", prompt)
        assert _loads(third) == 0, "a dead worker's blocks are not hits"

        cluster.workers[1] = Worker(cluster.configs, 1)  # the rank restarted: an empty pool
        fourth = cluster.serve("fourth", prompt)
        assert _loads(fourth) == 0
        assert len(_merged(fourth, 1, 1)) == 3  # stored again, by the new rank 1 only
        fifth = cluster.serve("fifth", prompt)
        assert _loads(fifth) == 3, "the index serves the restarted rank"
        assert _merged(fifth, 0, 2) == stored[0]
    finally:
        cluster.stop()
