"""`LLM(...).generate` on vLLM's CPU build with ActiveKV's connector, exact mode, against the same
run without it: repeated prefixes come back as external hits (vLLM's own counters), and the
greedy outputs are identical token for token."""

from __future__ import annotations

from cpu_checks import agreement, check_hits_and_evictions, hit_requests, max_logprob_gap
from cpu_workload import BLOCK_SIZE, DEVICE_BLOCKS, ORDER, POOL_BLOCKS, PREFIX_WORDS, PREFIXES


def test_sizes_evict_from_both_caches():
    # The working set (each prefix's full blocks, about one token a word) outgrows both the
    # device cache and the host pool; a prefix fits in the device cache, three in the pool (the
    # workload repeats a prefix after two others).
    prefix_blocks = PREFIX_WORDS // BLOCK_SIZE
    assert 3 * prefix_blocks < POOL_BLOCKS < PREFIXES * prefix_blocks
    assert prefix_blocks < DEVICE_BLOCKS < PREFIXES * prefix_blocks
    assert len(set(ORDER)) == PREFIXES < len(ORDER)


def test_without_the_connector_no_external_hits(llm_run):
    off = llm_run("off")
    assert off["totals"]["vllm:external_prefix_cache_hits"] == 0
    assert not hit_requests(off)


def test_repeated_prefixes_are_external_hits(llm_run, measured):
    exact = llm_run("exact")
    check_hits_and_evictions(exact)
    hits = hit_requests(exact)
    measured(
        f"exact: external hits {exact['totals']['vllm:external_prefix_cache_hits']} tokens "
        f"(requests {hits}: {[exact['requests'][i]['external_hits'] for i in hits]}), local hits "
        f"{[exact['requests'][i]['local_hits'] for i in hits]}, startup {exact['startup_s']} s, "
        f"generate {exact['generate_s']} s"
    )


def test_exact_mode_is_token_for_token_identical(llm_run, measured):
    off, exact = llm_run("off"), llm_run("exact")
    for i, (a, b) in enumerate(zip(exact["requests"], off["requests"], strict=True)):
        assert a["token_ids"] == b["token_ids"], f"request {i} (prefix {a['prefix']}) differs"
    assert agreement(exact, off, hit_requests(exact)) == 1.0
    measured(
        f"exact vs off: tokens identical; largest logprob gap {max_logprob_gap(exact, off):.3g} "
        f"(off: startup {off['startup_s']} s)"
    )
