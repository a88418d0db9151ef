"""vLLM's OpenAI-compatible server on the CPU with ActiveKV's connector, as a real process
(cpu_server.py): repeated prefixes sent to /v1/completions come back as external hits on its
/metrics; a restart with the same settings starts with an empty pool and answers the same; and a
misspelt extra-config key stops the server at start-up with the connector's one-line error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cpu_server import Server
from cpu_workload import ORDER, pool_bytes, prompts, transfer_config

HITS = "vllm:external_prefix_cache_hits"


def serve_workload(server: Server) -> list[tuple[str, float]]:
    """Each prompt's completion and its external hits (the counter's growth across it)."""
    answers = []
    for _, prompt in prompts():
        before = server.counter(HITS)
        text = server.complete(prompt)
        answers.append((text, server.counter(HITS) - before))
    return answers


@pytest.fixture(scope="module")
def start_server(
    vllm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """start(name, transfer): a server started, not yet ready; every one is stopped (its whole
    process group) at the module's end, even when a test fails."""
    folder = tmp_path_factory.mktemp("servers")
    env = {**vllm_env, "VLLM_CPU_OMP_THREADS_BIND": "0"}  # as the offline runs, one core
    started: list[Server] = []

    def start(name: str, transfer: dict[str, Any]) -> Server:
        started.append(Server(transfer, env, Path(folder) / f"{name}.log"))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def first_and_restarted(start_server: Any) -> tuple[list[tuple[str, float]], Server]:
    """The workload's answers from a first server, then a second one started with the same
    settings after the first has exited (returned ready, nothing sent to it yet)."""
    first = start_server("first", transfer_config("exact"))
    assert first.wait_ready(), f"the server exited while starting:\n{first.tail()}"
    answers = serve_workload(first)
    code = first.stop()
    assert code in (0, -15), f"the first server exited {code}:\n{first.tail()}"  # or SIGTERM
    second = start_server("restarted", transfer_config("exact"))
    assert second.wait_ready(), f"the restarted server exited while starting:\n{second.tail()}"
    return answers, second


def test_served_repeated_prefixes_are_external_hits(first_and_restarted, measured):
    answers, _ = first_and_restarted
    hits = [i for i, (_, count) in enumerate(answers) if count > 0]
    assert hits, f"no external hits on /metrics: {answers}"
    # Only a prefix the server has seen before can come back from the pool.
    assert all(ORDER[:i].count(ORDER[i]) for i in hits), hits
    measured(f"server: external hits {[answers[i][1] for i in hits]} tokens on requests {hits}")


def test_restart_starts_cold_and_answers_the_same(first_and_restarted):
    answers, second = first_and_restarted
    assert second.counter(HITS) == 0
    # The first request that hit before goes first now: a pool or index left behind by the
    # first server would serve it; a cold start computes it.
    i = next(i for i, (_, count) in enumerate(answers) if count > 0)
    text = second.complete(prompts()[i][1])
    assert second.counter(HITS) == 0, "the restarted server found blocks of the first one"
    assert text == answers[i][0]
    again = serve_workload(second)
    assert [t for t, _ in again] == [t for t, _ in answers]
    assert sum(count for _, count in again) > 0  # warm again, and still the same answers


def test_misspelt_extra_config_stops_the_server(start_server):
    transfer = transfer_config("exact")
    extra = transfer["kv_connector_extra_config"]
    assert isinstance(extra, dict)
    del extra["cpu_bytes"]
    extra["cpu_byte"] = pool_bytes("exact")
    server = start_server("misspelt", transfer)
    assert not server.wait_ready(), "the server started with a misspelt key"
    assert server.process.wait() != 0
    # The connector's error, one line, as bindings/connector_config.h words it.
    error = (
        'ConnectorConfigError: kv_transfer_config.kv_connector_extra_config["cpu_byte"]: '
        'unknown key (did you mean "cpu_bytes"?); expected one of mode, device, cpu_bytes, '
        "num_regions, region_blocks"
    )
    lines = server.log.read_text(errors="replace").splitlines()
    assert any(line.endswith(error) for line in lines), server.tail()
