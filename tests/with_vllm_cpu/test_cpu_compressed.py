"""int8 and fp8 pools on vLLM's CPU build: the lossy modes still serve repeated prefixes as
external hits, and the greedy tokens of those requests are compared with the connector-off run.
The agreement is measured and reported (docs/vllm-cpu.md), not held to a floor: how far a
quantised prefix moves a random-weight model's greedy choice is a property of that model."""

from __future__ import annotations

import pytest
from cpu_checks import agreement, check_hits_and_evictions, hit_requests, max_logprob_gap


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_compressed_mode_hits_and_agreement(llm_run, measured, mode):
    run, off = llm_run(mode), llm_run("off")
    check_hits_and_evictions(run)
    hits = hit_requests(run)
    # Requests before any hit read nothing back from the pool: they must match exactly.
    first = hits[0]
    assert agreement(run, off, list(range(first))) == 1.0
    on_hits = agreement(run, off, hits)
    overall = agreement(run, off, list(range(len(run["requests"]))))
    assert 0.0 <= on_hits <= 1.0
    identical = [i for i in hits if agreement(run, off, [i]) == 1.0]
    measured(
        f"{mode}: token agreement with connector off {on_hits:.3f} over the {len(hits)} requests "
        f"with external hits ({len(identical)} identical), {overall:.3f} over all "
        f"{len(run['requests'])}; external hits {run['totals']['vllm:external_prefix_cache_hits']}"
        f" tokens; largest logprob gap while tokens agree {max_logprob_gap(run, off):.3g}"
    )
