"""What the connector holds across a request's life with the real Scheduler: after requests
finish, are aborted, or are preempted and resumed, no request, pin, storing block or step is left,
and the pool's accounting is what it was. A load whose fence fails is reported to vLLM as invalid
blocks, which it recomputes; it is never counted as loaded."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from test_real_kv_caches import Rig

from release.scripts.served_path_driver import worker_step

SPEC = ("float16", 16, 2, 64)


def _settled(rig: Rig, *, committed: int | None = None) -> dict[str, Any]:
    """The worker's pool state, once the scheduler half tracks no request and the worker holds
    no pin, storing block or step; its published index matches its pool."""
    assert rig.scheduler.connector._core.state["requests"] == 0
    state = rig.worker._core.state
    assert (state["pinned_blocks"], state["storing_blocks"], state["step_running"]) == (0, 0, False)
    assert state["invariants"] == "", state
    assert state["published_blocks"] == state["committed_blocks"], state
    if committed is not None:
        assert state["committed_blocks"] == committed, state
    return state


def _events(rig: Rig) -> dict[str, int]:
    """Engine events by kind, as the worker half drained them."""
    return dict(rig.worker._core.event_counts)


def _prompt(blocks: int, salt: int = 0) -> list[int]:
    return [(7 * i + salt) % 500 for i in range(blocks * SPEC[1] + 1)]


def test_finished_requests_leave_nothing_held(activekv_site: Path, tmp_path: Path) -> None:
    rig = Rig(tmp_path, "LBNHC", SPEC, "exact")
    before = rig.worker._core.state
    rig.serve("first", _prompt(3))
    rig.serve("second", _prompt(3))  # loads the first's blocks back
    state = _settled(rig, committed=3)
    assert state["free_slots"] == before["free_slots"] - 3
    assert _events(rig)["loaded"] == 3


def test_an_aborted_request_mid_prefill_leaves_nothing_held(
    activekv_site: Path, tmp_path: Path
) -> None:
    from vllm.v1.request import RequestStatus

    rig = Rig(tmp_path, "LBNHC", SPEC, "exact", step_tokens=32)  # two blocks a step
    rig.add("long", _prompt(6), max_tokens=4)
    plan, _ = rig.step()
    assert len(plan.stores) == 2  # the first chunk's full blocks
    rig.scheduler.finish_requests("long", RequestStatus.FINISHED_ABORTED)
    while rig.scheduler.has_requests():
        rig.step()
    rig.step()  # the step that reports the abort as finished
    _settled(rig, committed=2)


def test_preempted_requests_resume_and_leave_nothing_held(
    activekv_site: Path, tmp_path: Path
) -> None:
    """Two requests decoding on too few device blocks: vLLM preempts one (its blocks freed) and
    resumes it later; the connector follows its new block ids and ends holding nothing."""
    rig = Rig(tmp_path, "LBNHC", SPEC, "exact", num_blocks=10)
    rig.add("a", _prompt(3, 1), max_tokens=40)
    rig.add("b", _prompt(3, 2), max_tokens=40)
    preempted = 0
    steps = 0
    while rig.scheduler.has_requests() and steps < 400:
        before = len(rig.scheduler.waiting)
        rig.step()
        preempted += len(rig.scheduler.waiting) > before
        steps += 1
    assert not rig.scheduler.has_requests()
    assert preempted > 0, "the scenario must preempt a request"
    _settled(rig)


def test_a_failed_load_is_reported_as_invalid_blocks_and_recomputed(
    activekv_site: Path, tmp_path: Path
) -> None:
    rig = Rig(tmp_path, "LBNHC", SPEC, "exact")
    rig.serve("first", _prompt(3))
    rig.randomize()
    rig.add("second", _prompt(3))
    plan, invalid = rig.step(before_load=lambda core: core.inject_fence_fault("load", 0))
    assert len(plan.loads) == 3
    assert invalid == {block for _, block in plan.loads}  # every load of the lost lease
    while rig.scheduler.has_requests():  # vLLM recomputes them; the request completes
        _, more = rig.step()
        assert not more
    state = _settled(rig, committed=3)
    assert state["quarantined_regions"] == 1
    counts = _events(rig)
    assert counts.get("load_error", 0) == 3 and counts.get("loaded", 0) == 0


def test_a_planned_load_the_pool_no_longer_holds_is_reported_invalid(
    activekv_site: Path, tmp_path: Path
) -> None:
    """The scheduler half saw a block committed, but it was evicted before the worker's step (a
    store in between, as under async scheduling): its device block is reported as a failed load,
    so vLLM recomputes it instead of reading whatever the block held."""
    from activekv._vllm import StepPlan
    from activekv.vllm_connector import ActiveKVMetadata

    rig = Rig(tmp_path, "LBNHC", SPEC, "exact")
    rig.serve("first", _prompt(2))
    metadata = ActiveKVMetadata()
    metadata.plan = StepPlan(loads=[(0x5EED, 4)], stores=[])  # a key never stored
    step = SimpleNamespace(kv_connector_metadata=metadata, has_sync_kv_loads=False,
                           total_num_scheduled_tokens=1, finished_req_ids=set())  # fmt: skip
    assert worker_step(rig.worker, step, rig.kv, rig.names) == {4}
    assert _events(rig).get("miss") == 1
    _settled(rig, committed=2)
