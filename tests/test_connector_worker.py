"""The vLLM connector core (activekv._vllm.ConnectorCore) on duck-typed vLLM objects, no vLLM:
what its worker half keeps alive, how a refused hook leaves the engine, and its scheduler half
looked up from several threads.

* Worker cores of one engine_id share one engine (vLLM makes one worker connector per process,
  but a new one may be made before the last is collected): the KV caches the engine views live
  with the engine, not with the core that registered them.
* A step refused for one of its stores plans none of its loads (engine/offload/SPEC.md §6 rule
  11); a hook before register_kv_caches plans nothing; either leaves the worker usable.
* Engine state errors keep their type through activekv._vllm (EngineStateError).
* The scheduler half reads the shared block index from vLLM's threads with the GIL released,
  while a worker's table is removed and made again.

What may crash the interpreter runs in a child process.
"""

from __future__ import annotations

import gc
import inspect
import os
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import numpy as np
import pytest

# A small geometry: [2, BLOCKS, BLOCK, HEADS, HEAD_DIM] float16 per layer.
LAYERS = ["l0", "l1"]
BLOCK, HEADS, HEAD_DIM, BLOCKS = 4, 2, 8, 16
SHAPE = (2, BLOCKS, BLOCK, HEADS, HEAD_DIM)


def configs(
    engine_id: str, *, blocks: int, block: int, heads: int, head_dim: int, layers: list[str],
    region_blocks: int, cpu_bytes: int,
) -> tuple[Any, Any]:  # fmt: skip
    """vLLM's configs as the core reads them, duck-typed; one float16 attention group."""
    spec = NS(block_size=block, num_kv_heads=heads, head_size=head_dim, head_size_v=head_dim,
              dtype="torch.float16")  # fmt: skip
    extra = {"cpu_bytes": cpu_bytes, "num_regions": 2, "region_blocks": region_blocks,
             "device": "cpu"}  # fmt: skip
    vllm_config = NS(kv_transfer_config=NS(kv_connector_extra_config=extra, engine_id=engine_id),
                     device_config=NS(device_type="cpu"))  # fmt: skip
    group = NS(layer_names=layers, kv_cache_spec=spec)
    return vllm_config, NS(num_blocks=blocks, kv_cache_groups=[group])


# What the child processes below start with.
CONFIGS = "from types import SimpleNamespace as NS\nfrom typing import Any\n\n" + inspect.getsource(
    configs
)


@pytest.fixture(scope="module")
def modules(activekv_site: Path) -> tuple[Any, Any]:
    """activekv._engine and activekv._vllm from the wheel under test."""
    import activekv._engine as engine
    import activekv._vllm as vllm

    return engine, vllm


def worker(vllm: Any, name: str) -> Any:
    vllm_config, kv_cache_config = configs(
        f"{name}-{os.getpid()}", blocks=BLOCKS, block=BLOCK, heads=HEADS, head_dim=HEAD_DIM,
        layers=LAYERS, region_blocks=8, cpu_bytes=1 << 20,
    )  # fmt: skip
    return vllm.ConnectorCore(vllm_config, NS(name="WORKER"), kv_cache_config)


def connector(vllm: Any, loads: list[tuple[int, int]] = (), stores: list[tuple[int, int]] = ()):
    """The shim as the core sees it: its step's metadata carries the scheduler's StepPlan."""
    plan = vllm.StepPlan(list(loads), list(stores))
    return NS(_get_connector_metadata=lambda: NS(plan=plan))


def step(core: Any, shim: Any) -> set[int]:
    """One worker step in the model runner's order; the blocks reported as failed loads."""
    core.start_load_kv(shim, None)
    for name in LAYERS:
        core.wait_for_layer_load(shim, name)
        core.save_kv_layer(shim, name, None, None)
    core.wait_for_save(shim)
    return core.get_block_ids_with_load_errors()


def caches(fill: float = 0.0) -> dict[str, np.ndarray]:
    return {name: np.full(SHAPE, fill, np.float16) for name in LAYERS}


def run_child(engine_site: Path, script: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", f"import sys\nsys.path.insert(0, {str(engine_site)!r})\n{script}"],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


# ---- worker cores sharing one engine ----


def test_the_shared_engine_keeps_the_caches_it_views_alive(modules: tuple[Any, Any]) -> None:
    _, vllm = modules
    first, second = worker(vllm, "shared"), worker(vllm, "shared")
    mine, theirs = caches(0.0), caches(1.0)
    first.register_kv_caches(mine)
    second.register_kv_caches(theirs)  # the engine now views these, for both cores
    watch_mine = [weakref.ref(array) for array in mine.values()]
    watch_theirs = [weakref.ref(array) for array in theirs.values()]
    kept = theirs[LAYERS[0]]
    del mine, theirs, second
    gc.collect()
    # The registering core is gone, its arrays are not: the engine still views them.
    assert all(watch() is not None for watch in watch_theirs)
    assert all(watch() is None for watch in watch_mine)  # replaced: let go
    # A step of the remaining core stores from them and loads back into them.
    kept[:, 3] = 7.0
    assert step(first, connector(vllm, stores=[(11, 3)])) == set()
    assert step(first, connector(vllm, loads=[(11, 9)])) == set()
    assert (kept[:, 9] == 7.0).all()
    assert first.event_counts == {"commit": 1, "hit": 1, "loaded": 1}
    del kept, first
    gc.collect()
    assert all(watch() is None for watch in watch_theirs)  # the engine went with its last core


def test_a_store_after_the_registering_core_is_gone_does_not_crash(engine_site: Path) -> None:
    """The reviewer's reproduction (it crashed with SIGSEGV): large caches, so that freeing them
    unmaps their memory."""
    script = (
        CONFIGS
        + """
import gc, os
import numpy as np
import activekv._vllm as vllm
config, kv_cache_config = configs(f"uaf-{os.getpid()}", blocks=64, block=16, heads=8, head_dim=64,
                                  layers=["l0"], region_blocks=64, cpu_bytes=1 << 24)
a = vllm.ConnectorCore(config, NS(name="WORKER"), kv_cache_config)
b = vllm.ConnectorCore(config, NS(name="WORKER"), kv_cache_config)
a.register_kv_caches({"l0": np.zeros((2, 64, 16, 8, 64), np.float16)})
b.register_kv_caches({"l0": np.ones((2, 64, 16, 8, 64), np.float16)})
del b
gc.collect()
plan = vllm.StepPlan([], [(11, 1)])
shim = NS(_get_connector_metadata=lambda: NS(plan=plan))
a.start_load_kv(shim, None)
a.wait_for_layer_load(shim, "l0")
a.save_kv_layer(shim, "l0", None, None)
a.wait_for_save(shim)
print(a.event_counts)
"""
    )
    result = run_child(engine_site, script, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.strip() == "{'commit': 1}"


# ---- refused hooks leave the worker usable ----


def test_a_step_refused_for_a_store_runs_none_of_its_loads_later(modules: tuple[Any, Any]) -> None:
    engine, vllm = modules
    core = worker(vllm, "half-refused")
    kv = caches()
    core.register_kv_caches(kv)
    for layer in kv.values():
        layer[:, 5] = 3.0
    step(core, connector(vllm, stores=[(1, 5)]))
    # Its load is good, its store's device block is not: the hook refuses the whole step.
    with pytest.raises(
        engine.EngineInputError, match=r"device_blocks\[0\]: expected 0 <="
    ) as caught:
        core.start_load_kv(connector(vllm, loads=[(1, 2)], stores=[(9, 99)]), None)
    # The next step plans nothing: block 2 is neither reported nor overwritten.
    assert step(core, connector(vllm)) == set()
    assert core.event_counts == {"commit": 1}
    assert all((layer[:, 2] == 0).all() for layer in kv.values())
    assert core.state["pinned_blocks"] == 0
    expected = f"store_device_blocks[0]: expected 0 <= device block < {BLOCKS}; got 99"
    assert str(caught.value) == expected
    assert step(core, connector(vllm, loads=[(1, 2)])) == set()
    assert all((layer[:, 2] == 3.0).all() for layer in kv.values())


def test_a_hook_before_register_kv_caches_plans_nothing(modules: tuple[Any, Any]) -> None:
    engine, vllm = modules
    core = worker(vllm, "unregistered")
    shim = connector(vllm, stores=[(1, 0)])
    refused = []
    for name, hook in (
        ("start_load_kv", lambda: core.start_load_kv(shim, None)),
        ("wait_for_layer_load", lambda: core.wait_for_layer_load(shim, LAYERS[0])),
        ("save_kv_layer", lambda: core.save_kv_layer(shim, LAYERS[0], None, None)),
        ("wait_for_save", lambda: core.wait_for_save(shim)),
    ):
        with pytest.raises(RuntimeError, match="register_kv_caches") as caught:
            hook()
        refused.append((name, caught.value))
    assert core.state["step_running"] is False
    core.register_kv_caches(caches(2.0))
    assert step(core, shim) == set()  # the engine was left as it was: the step runs
    assert core.event_counts == {"commit": 1}
    for name, error in refused:
        assert type(error) is engine.EngineStateError
        assert str(error) == f"{name}: called out of order; expected register_kv_caches first"


def test_engine_state_errors_keep_their_type_through_the_connector(
    modules: tuple[Any, Any],
) -> None:
    engine, vllm = modules
    core = worker(vllm, "state-error")
    core.register_kv_caches(caches())
    with pytest.raises(engine.EngineStateError, match="wait_for_layer_load") as caught:
        core.wait_for_layer_load(connector(vllm), LAYERS[1])  # layer 1 before layer 0
    assert isinstance(caught.value, RuntimeError)


# ---- the KV tensors refused, named ----


def _split(good: np.ndarray) -> np.ndarray:
    """`good`'s shape with elements 17 bytes apart along its last dimension."""
    spread = np.zeros(good.size * 17 + 4, np.uint8)
    strides = tuple(stride // good.itemsize * 17 for stride in good.strides)
    return np.ndarray(good.shape, good.dtype, spread, 0, strides)


@pytest.mark.parametrize(
    ("case", "make", "says"),
    [
        ("byte-swapped", lambda good: good.astype(">f2"),
         "expected an array in this machine's byte order; got one of dtype >f2 (byte-swapped)"),
        ("objects", lambda good: good.astype(object),
         "expected an array of numbers (numpy or DLPack); got one of dtype object"),
        ("structured", lambda good: np.zeros(good.shape, [("k", "<f2")]),
         "expected an array of numbers (numpy or DLPack); got one of dtype [('k', '<f2')]"),
        ("datetime", lambda good: np.zeros(good.shape, "M8[s]"),
         "expected an array of numbers (numpy or DLPack); got one of dtype datetime64[s]"),
        ("split elements", _split,
         "expected strides that are multiples of its 2-byte elements; got "
         "[17408, 1088, 272, 136, 17] (in bytes)"),
        ("a scalar", lambda good: np.float16(1),
         "expected an array (numpy or DLPack); got a float16 scalar"),
    ],
)  # fmt: skip
def test_a_tensor_no_binding_can_take_is_named_by_its_dtype_or_strides(
    modules: tuple[Any, Any], case: str, make: Any, says: str
) -> None:
    engine, vllm = modules
    core = worker(vllm, f"refused-{case}")
    good = np.zeros(SHAPE, np.float16)
    with pytest.raises(engine.EngineInputError) as caught:
        core.register_kv_caches({LAYERS[0]: good, LAYERS[1]: make(good)})
    assert str(caught.value) == f'kv_caches["{LAYERS[1]}"]: {says}'


# ---- the scheduler half from several threads ----


def test_scheduler_lookups_from_threads_while_a_worker_table_is_replaced(
    engine_site: Path,
) -> None:
    """The reviewer's reproduction (SIGSEGV within 40 s before the reader took a mutex): two
    threads look a 4096-block chain up while a third makes a worker, commits the chain and ends
    it, so its table is removed and made again under the readers."""
    script = (
        CONFIGS
        + """
import os, threading, time
import numpy as np
import activekv._vllm as vllm
N = 4096
config, kv_cache_config = configs(f"threads-{os.getpid()}", blocks=N, block=1, heads=1,
                                  head_dim=8, layers=["l0"], region_blocks=N, cpu_bytes=1 << 18)
scheduler = vllm.ConnectorCore(config, NS(name="SCHEDULER"), kv_cache_config)
hashes = list(range(1, N + 1))
stop = threading.Event()
seen = set()
failures = []

def look(index):
    request = NS(request_id=f"r{index}", block_hashes=hashes, num_tokens=N + 1)
    try:
        while not stop.is_set():
            seen.add(scheduler.get_num_new_matched_tokens(request, 0)[0])
    except BaseException as error:
        failures.append(repr(error))

def churn():
    plan = vllm.StepPlan([], [(h, h - 1) for h in hashes])
    shim = NS(_get_connector_metadata=lambda: NS(plan=plan))
    kv = {"l0": np.zeros((2, N, 1, 1, 8), np.float16)}
    try:
        while not stop.is_set():
            core = vllm.ConnectorCore(config, NS(name="WORKER"), kv_cache_config)
            core.register_kv_caches(kv)
            core.start_load_kv(shim, None)
            core.wait_for_layer_load(shim, "l0")
            core.save_kv_layer(shim, "l0", None, None)
            core.wait_for_save(shim)
            del core  # its table is removed; the next core makes it again
    except BaseException as error:
        failures.append(repr(error))

threads = [threading.Thread(target=look, args=(i,)) for i in range(2)]
threads.append(threading.Thread(target=churn))
for thread in threads:
    thread.start()
time.sleep(float(os.environ.get("CHURN_SECONDS", "15")))
stop.set()
for thread in threads:
    thread.join()
print(failures, sorted(seen - {0, N}))
"""
    )
    result = run_child(engine_site, script, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    # Never an error; only no hit or the whole chain.
    assert result.stdout.strip() == "[] []", result.stdout
