"""Tensor parallel 2 on vLLM's CPU build: two worker processes (vLLM's multiprocess executor,
gloo between them), each with its own KV shard and its own ActiveKV pool; the scheduler counts a
block as a hit only where both workers hold it (engine/offload/SPEC.md §9)."""

from __future__ import annotations

import os

import pytest
from cpu_checks import check_hits_and_evictions


def test_tensor_parallel_2_hits_and_matches_tp1(llm_run, measured):
    if (os.cpu_count() or 1) < 2:
        pytest.skip(f"needs a core for each of 2 workers; got {os.cpu_count()}")
    tp2, off = llm_run("exact", 2), llm_run("off")
    check_hits_and_evictions(tp2)
    # Compared with the single-worker run without the connector: splitting the heads over two
    # workers changes the logprobs in the last bits (the all-reduce adds in another order), but
    # on this model not the greedy tokens.
    for i, (a, b) in enumerate(zip(tp2["requests"], off["requests"], strict=True)):
        assert a["token_ids"] == b["token_ids"], f"request {i} (prefix {a['prefix']}) differs"
    measured(
        f"tp2 exact: external hits {tp2['totals']['vllm:external_prefix_cache_hits']} tokens, "
        f"tokens identical to tp1 off; startup {tp2['startup_s']} s"
    )
