"""What the CPU tests read out of a driver run (cpu_llm_driver.py's JSON)."""

from __future__ import annotations

from typing import Any

from cpu_workload import BLOCK_SIZE, ORDER


def hit_requests(run: dict[str, Any]) -> list[int]:
    """Indexes of the requests vLLM counted external prefix-cache hits for."""
    return [i for i, r in enumerate(run["requests"]) if r["external_hits"] > 0]


def check_hits_and_evictions(run: dict[str, Any]) -> None:
    """The properties the workload's sizes are chosen for, read from vLLM's own counters: a
    repeated prefix comes back from the connector as external hits; those requests found at most
    part of it in the device cache (it was evicted there); vLLM's per-request cached count is
    the local plus the external hits; and some repeated prefix found nothing in either cache,
    since the host pool is smaller than the working set."""
    requests = run["requests"]
    hits = hit_requests(run)
    assert hits, f"no request got external hits: {requests}"
    assert run["totals"]["vllm:external_prefix_cache_hits"] == sum(
        r["external_hits"] for r in requests
    )
    for i in hits:
        r = requests[i]
        assert ORDER[:i].count(r["prefix"]) > 0, f"request {i}: external hits on a new prefix"
        assert r["external_hits"] % BLOCK_SIZE == 0, r
        assert r["local_hits"] < r["num_cached_tokens"], f"request {i}: all hits were local: {r}"
        assert r["num_cached_tokens"] == r["local_hits"] + r["external_hits"], r
    evicted_everywhere = [
        i
        for i, r in enumerate(requests)
        if ORDER[:i].count(r["prefix"]) > 0 and r["num_cached_tokens"] == 0
    ]
    assert evicted_everywhere, f"every repeated prefix was still cached somewhere: {requests}"


def agreement(run: dict[str, Any], reference: dict[str, Any], requests: list[int]) -> float:
    """The fraction of generated tokens of `requests` equal, position by position, to the
    reference run's (greedy, same prompts); 1.0 means token for token identical."""
    same = total = 0
    for i in requests:
        ours, theirs = run["requests"][i]["token_ids"], reference["requests"][i]["token_ids"]
        assert len(ours) == len(theirs), (i, ours, theirs)
        same += sum(a == b for a, b in zip(ours, theirs, strict=True))
        total += len(ours)
    return same / total if total else 1.0


def max_logprob_gap(run: dict[str, Any], reference: dict[str, Any]) -> float:
    """The largest difference between the two runs' logprobs of the same sampled token, over
    the positions where both runs sampled the same token so far."""
    gap = 0.0
    for ours, theirs in zip(run["requests"], reference["requests"], strict=True):
        for a, b, x, y in zip(
            ours["token_ids"], theirs["token_ids"], ours["logprobs"], theirs["logprobs"],
            strict=True,
        ):  # fmt: skip
            if a != b:
                break
            gap = max(gap, abs(x - y))
    return gap
