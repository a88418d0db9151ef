"""The vLLM connector core (activekv._vllm.ConnectorCore) refuses what it cannot honour, on
duck-typed vLLM objects (no vLLM installed):

* a worker core whose engine_id names an engine this process already runs with other settings
  (pool size, regions, mode, device, KV layout, layers, ranks) was silently given that engine:
  it is refused, one line per setting that differs, naming the key, the live engine's value and
  the value given. An identical configuration still shares the engine, and once the engine is
  gone its engine_id may start again with other settings;
* a role that is not vLLM's KVConnectorRole.SCHEDULER or .WORKER (the string "scheduler", an
  int, None) was taken for a worker: it is refused, naming `role`.
"""

from __future__ import annotations

import gc
import importlib.util
import os
from types import SimpleNamespace as NS
from typing import Any

import pytest
from test_connector_worker import BLOCK, BLOCKS, HEAD_DIM, HEADS, LAYERS, caches, connector, step

EXTRA = "kv_transfer_config.kv_connector_extra_config"
SPEC = "kv_cache_config.kv_cache_groups[0].kv_cache_spec"
NAMES = "kv_cache_config.kv_cache_groups[0].layer_names"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="duck-typed roles stand in for vLLM's KVConnectorRole only where vLLM is absent",
)


@pytest.fixture(scope="module")
def vllm(activekv_site: Any) -> Any:
    import activekv._vllm as module

    return module


def configs(engine_id: str, **changes: Any) -> tuple[Any, Any]:
    """vLLM's configs as the core reads them; `changes` override the defaults below by name."""
    given = dict(block=BLOCK, heads=HEADS, head_dim=HEAD_DIM, dtype="torch.float16",
                 layers=LAYERS, blocks=BLOCKS, extra={}, parallel=None)  # fmt: skip
    given.update(changes)
    spec = NS(block_size=given["block"], num_kv_heads=given["heads"], head_size=given["head_dim"],
              head_size_v=given["head_dim"], dtype=given["dtype"])  # fmt: skip
    extra = {"cpu_bytes": 1 << 20, "num_regions": 2, "region_blocks": 8, "device": "cpu",
             **given["extra"]}  # fmt: skip
    vllm_config = NS(kv_transfer_config=NS(kv_connector_extra_config=extra, engine_id=engine_id),
                     device_config=NS(device_type="cpu"))  # fmt: skip
    if given["parallel"] is not None:
        vllm_config.parallel_config = given["parallel"]
    group = NS(layer_names=given["layers"], kv_cache_spec=spec)
    return vllm_config, NS(num_blocks=given["blocks"], kv_cache_groups=[group])


def core(vllm: Any, engine_id: str, role: str = "WORKER", **changes: Any) -> Any:
    vllm_config, kv_cache_config = configs(engine_id, **changes)
    return vllm.ConnectorCore(vllm_config, NS(name=role), kv_cache_config)


def running(engine_id: str) -> str:
    return f' (the engine "{engine_id}" of this process already runs with it); got '


# (what is changed, the key it is named by, the live engine's value, the value given)
DIFFERENT = [
    ({"extra": {"cpu_bytes": 2 << 20}}, f'{EXTRA}["cpu_bytes"]', "1048576", "2097152"),
    ({"extra": {"num_regions": 3}}, f'{EXTRA}["num_regions"]', "2", "3"),
    ({"extra": {"region_blocks": 4}}, f'{EXTRA}["region_blocks"]', "8", "4"),
    ({"extra": {"mode": "int8"}}, f'{EXTRA}["mode"]', '"exact"', '"int8"'),
    ({"extra": {"device": "cuda"}}, f'{EXTRA}["device"]', '"cpu"', '"cuda"'),
    ({"block": 8}, f"{SPEC}.block_size", str(BLOCK), "8"),
    ({"heads": 4}, f"{SPEC}.num_kv_heads", str(HEADS), "4"),
    ({"head_dim": 16}, f"{SPEC}.head_size", str(HEAD_DIM), "16"),
    ({"dtype": "torch.bfloat16"}, f"{SPEC}.dtype", "torch.float16", "torch.bfloat16"),
    ({"blocks": 32}, "kv_cache_config.num_blocks", str(BLOCKS), "32"),
    ({"layers": ["l0", "l1", "l2"]}, f"{NAMES} (count)", "2", "3"),
    ({"layers": ["l0", "other"]}, f"{NAMES}[1]", '"l1"', '"other"'),
    ({"parallel": NS(world_size=2, rank=0)}, "vllm_config.parallel_config.world_size", "1", "2"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "key", "live", "given"), DIFFERENT, ids=lambda v: str(v))
def test_a_worker_of_a_running_engine_id_with_another_setting_is_refused_by_key(
    vllm: Any, changes: dict[str, Any], key: str, live: str, given: str
) -> None:
    engine_id = f"differs-{os.getpid()}-{key}"
    first = core(vllm, engine_id)
    first.register_kv_caches(caches(1.0))
    with pytest.raises(vllm.ConnectorConfigError) as refused:
        core(vllm, engine_id, **changes)
    assert str(refused.value) == f"{key}: expected {live}{running(engine_id)}{given}"
    assert isinstance(refused.value, ValueError)
    # The refusal changed nothing: the live engine still steps, with its caches.
    assert step(first, connector(vllm, stores=[(5, 3)])) == set()
    assert first.event_counts == {"commit": 1}


def test_every_setting_that_differs_is_named_in_one_line(vllm: Any) -> None:
    engine_id = f"differs-many-{os.getpid()}"
    kept = core(vllm, engine_id)
    with pytest.raises(vllm.ConnectorConfigError) as refused:
        core(vllm, engine_id, extra={"cpu_bytes": 2 << 20, "region_blocks": 4})
    message = str(refused.value)
    assert message == (
        f'{EXTRA}["cpu_bytes"]: expected 1048576{running(engine_id)}2097152; '
        f'{EXTRA}["region_blocks"]: expected 8{running(engine_id)}4'
    )
    assert "\n" not in message
    del kept


def test_another_rank_of_one_engine_id_in_this_process_is_refused(vllm: Any) -> None:
    engine_id = f"rank-{os.getpid()}"
    kept = core(vllm, engine_id, parallel=NS(world_size=2, rank=0))
    with pytest.raises(vllm.ConnectorConfigError) as refused:
        core(vllm, engine_id, parallel=NS(world_size=2, rank=1))
    rank = "vllm_config.parallel_config.rank"
    assert str(refused.value) == f"{rank}: expected 0{running(engine_id)}1"
    del kept


def test_the_same_settings_share_the_engine_however_they_are_written(vllm: Any) -> None:
    """Defaults written out, fp8 for fp8_e4m3: the same engine, as the scheduler and worker halves
    and a restarted connector need."""
    engine_id = f"same-{os.getpid()}"
    first = core(vllm, engine_id, extra={"mode": "fp8"})
    second = core(vllm, engine_id, extra={"mode": "fp8_e4m3", "cpu_bytes": 1 << 20})
    first.register_kv_caches(caches(2.0))
    assert step(first, connector(vllm, stores=[(7, 1)])) == set()
    # The second core sees the block the first committed: one engine.
    assert second.state["committed_blocks"] == 1
    scheduler = core(vllm, engine_id, role="SCHEDULER", extra={"cpu_bytes": 4 << 20})
    assert scheduler.role == "SCHEDULER"  # the scheduler half holds no engine: nothing to match


def test_an_engine_id_whose_engine_is_gone_starts_again_with_other_settings(vllm: Any) -> None:
    engine_id = f"restart-{os.getpid()}"
    first = core(vllm, engine_id)
    del first
    gc.collect()
    again = core(vllm, engine_id, extra={"cpu_bytes": 2 << 20})
    assert again.state["free_slots"] > core(vllm, f"{engine_id}-small").state["free_slots"]


# ---- the role ----

NOT_ROLES = ["scheduler", "SCHEDULER", "WORKER", 0, 1, None, True, 1.0, NS(name="scheduler"),
             NS(name="worker"), NS(name=0), NS(name=None), NS(value=0), NS(), object]  # fmt: skip


@pytest.mark.parametrize("role", NOT_ROLES, ids=repr)
def test_a_role_that_is_not_a_kv_connector_role_is_refused_naming_role(
    vllm: Any, role: Any
) -> None:
    vllm_config, kv_cache_config = configs(f"role-{os.getpid()}")
    with pytest.raises(vllm.ConnectorConfigError) as refused:
        vllm.ConnectorCore(vllm_config, role, kv_cache_config)
    assert str(refused.value) == (
        "role: expected vLLM's KVConnectorRole.SCHEDULER or KVConnectorRole.WORKER; got "
        f"{role!r} ({type(role).__name__})"
    )


def test_the_role_is_checked_before_the_configuration(vllm: Any) -> None:
    """A refused role reads nothing: no engine made, no block index opened."""
    with pytest.raises(vllm.ConnectorConfigError, match=r"^role: expected"):
        vllm.ConnectorCore(NS(), "scheduler", NS())  # configs that cannot be read


@pytest.mark.parametrize("role", ["SCHEDULER", "WORKER"])
def test_the_two_roles_by_name_still_build_their_halves(vllm: Any, role: str) -> None:
    built = core(vllm, f"roles-{os.getpid()}", role=role)
    assert built.role == role
    assert ("requests" in built.state) == (role == "SCHEDULER")


SCHEDULER_HOOKS = {
    "get_num_new_matched_tokens": lambda core: core.get_num_new_matched_tokens(NS(), 0),
    "update_state_after_alloc": lambda core: core.update_state_after_alloc(NS(), NS(), 0),
    "build_connector_meta": lambda core: core.build_connector_meta(NS()),
}
WORKER_HOOKS = {
    "register_kv_caches": lambda core: core.register_kv_caches({}),
    "start_load_kv": lambda core: core.start_load_kv(NS(), None),
    "wait_for_layer_load": lambda core: core.wait_for_layer_load(NS(), "layer.0"),
    "save_kv_layer": lambda core: core.save_kv_layer(NS(), "layer.0", None, None),
    "wait_for_save": lambda core: core.wait_for_save(NS()),
    "inject_fence_fault": lambda core: core.inject_fence_fault("load", 0),
}


@pytest.mark.parametrize(
    ("hook", "role", "kind"),
    [(hook, "WORKER", "scheduler") for hook in SCHEDULER_HOOKS]
    + [(hook, "SCHEDULER", "worker") for hook in WORKER_HOOKS],
)
def test_a_hook_of_the_other_half_is_refused_naming_both(
    vllm: Any, hook: str, role: str, kind: str
) -> None:
    """vLLM calls each hook on one half only: one called on the other is a RuntimeError naming
    the hook and the half, before it reads its arguments, and the half holds what it held."""
    built = core(vllm, f"halves-{os.getpid()}", role=role)
    before = built.state
    with pytest.raises(RuntimeError) as refused:
        {**SCHEDULER_HOOKS, **WORKER_HOOKS}[hook](built)
    assert str(refused.value) == f"{hook}: a {kind} hook, called on the {role} half"
    assert built.state == before


def test_the_scheduler_half_has_no_failed_loads_and_no_events(vllm: Any) -> None:
    scheduler = core(vllm, f"scheduler-only-{os.getpid()}", role="SCHEDULER")
    assert scheduler.get_block_ids_with_load_errors() == set()
    assert scheduler.event_counts == {}
    assert scheduler.num_layers == len(LAYERS)
