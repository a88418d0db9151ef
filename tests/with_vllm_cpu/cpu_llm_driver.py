"""One offline vLLM run on the CPU: `LLM(...)` built from the arguments, then `generate` on each
prompt of cpu_workload.py in turn, greedy. Writes JSON with, per request, the tokens and their
logprobs, RequestOutput.num_cached_tokens, and the request's share of vLLM's own prefix-cache
counters (local and external hits), read from `LLM.get_metrics()` before and after it.

usage: python cpu_llm_driver.py MODE TP OUT.json   (MODE: off, exact, int8 or fp8)

Each configuration runs in its own process (conftest.py's llm_run starts it): the engine, its
workers and their thread pinning (VLLM_CPU_OMP_THREADS_BIND, set by the caller) belong to one
process tree, and a second LLM in the same interpreter would inherit the first one's
distributed state and thread pinning.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from cpu_tiny_model import REPO_ID
from cpu_workload import (
    BLOCK_SIZE,
    DEVICE_BLOCKS,
    MAX_MODEL_LEN,
    MAX_TOKENS,
    prompts,
    transfer_config,
)

COUNTERS = ("vllm:prefix_cache_hits", "vllm:external_prefix_cache_hits")


def counters(llm: Any) -> dict[str, int]:
    """vLLM's prefix-cache counters, summed over their labels (one engine here)."""
    totals = dict.fromkeys(COUNTERS, 0)
    for metric in llm.get_metrics():
        if metric.name in totals:
            totals[metric.name] += int(metric.value)
    return totals


def main(mode: str, tp: int, out: Path) -> None:
    started = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    settings: dict[str, Any] = {
        "model": REPO_ID,
        "dtype": "float32",
        "block_size": BLOCK_SIZE,
        "max_model_len": MAX_MODEL_LEN,
        "num_gpu_blocks_override": DEVICE_BLOCKS,  # the small device cache prefixes fall out of
        "enforce_eager": True,
        "disable_hybrid_kv_cache_manager": True,  # the connector takes one KV cache group
        "disable_log_stats": False,  # get_metrics() needs the stat loggers
        "seed": 0,
        "tensor_parallel_size": tp,
        "max_num_seqs": 4,
        "gpu_memory_utilization": 0.1,
    }
    if mode != "off":
        settings["kv_transfer_config"] = KVTransferConfig(**transfer_config(mode, tp))
    llm = LLM(**settings)
    ready = time.monotonic()
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0)
    requests = []
    for prefix, prompt in prompts():
        before = counters(llm)
        (output,) = llm.generate([prompt], greedy, use_tqdm=False)
        after = counters(llm)
        completion = output.outputs[0]
        requests.append(
            {
                "prefix": prefix,
                "prompt_tokens": len(output.prompt_token_ids),
                "num_cached_tokens": output.num_cached_tokens,
                "local_hits": after[COUNTERS[0]] - before[COUNTERS[0]],
                "external_hits": after[COUNTERS[1]] - before[COUNTERS[1]],
                "token_ids": list(completion.token_ids),
                "logprobs": [
                    step[token].logprob
                    for step, token in zip(completion.logprobs, completion.token_ids, strict=True)
                ],
            }
        )
    result = {
        "mode": mode,
        "tp": tp,
        "startup_s": round(ready - started, 1),
        "generate_s": round(time.monotonic() - ready, 2),
        "totals": counters(llm),
        "requests": requests,
    }
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
