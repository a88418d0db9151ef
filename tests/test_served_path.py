"""The served-path gate's verdicts (release/gates/served_path.py).

The judgement is tested here on driver results shaped as release/scripts/served_path_driver.py
prints them, each negative control planting one violation; tests/with_vllm/ runs the driver
itself against the real vLLM classes and the built wheel (nox -s vllm). Without vLLM the gate
must say "not run", never pass.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fixtures_wheels import build_files_wheel, build_wheel, wheel_set

from release.errors import GateError
from release.evidence import read_evidence
from release.gates.served_path import (
    SHIM_PATH,
    VllmPython,
    dispatch_line,
    for_pins,
    judge,
    run_served_path_gate,
    shared_file,
    vllm_interpreters,
)

PINS = ["0.32.0", "0.33.0"]
SUPPORTS = ">=0.32,<0.34"

SHIM_CODES = {
    "vllm_connector.py:22:ActiveKVConnector.get_num_new_matched_tokens": 1,
    "vllm_connector.py:25:ActiveKVConnector.update_state_after_alloc": 1,
    "vllm_connector.py:28:ActiveKVConnector.build_connector_meta": 1,
    "vllm_connector.py:36:ActiveKVConnector.start_load_kv": 1,
    "vllm_connector.py:39:ActiveKVConnector.wait_for_layer_load": 2,
    "vllm_connector.py:42:ActiveKVConnector.save_kv_layer": 2,
    "vllm_connector.py:45:ActiveKVConnector.wait_for_save": 1,
    "vllm_connector.py:48:ActiveKVConnector.get_block_ids_with_load_errors": 1,
}
HOOKS = {code.rsplit(".", 1)[1]: count for code, count in SHIM_CODES.items()}


def step(number: int, codes: dict[str, int], *, loads: int = 2) -> dict[str, Any]:
    return {
        "step": number,
        "scheduled_tokens": 35,
        "sync_loads": loads > 0,
        "loads": [[1000 + i, i] for i in range(loads)],
        "stores": [[2000, 7]],
        "load_errors": [],
        "loads_verified": loads,
        "load_mismatches": 0,
        "hooks": dict(HOOKS),
        "frames": sum(codes.values()),
        "codes": dict(codes),
        "max_depth": 1,
    }


def good_result() -> dict[str, Any]:
    reference_codes = {**SHIM_CODES, "engine.py:300:Engine.lookup": 4, "engine.py:40:_hashes": 9}
    events = {"lookup": 1, "hit": 2, "loaded": 2, "commit": 1}
    return {
        "engine": {"steps": [step(0, SHIM_CODES), step(1, SHIM_CODES)], "events": dict(events)},
        "reference": {
            "steps": [step(0, reference_codes), step(1, reference_codes)],
            "events": dict(events),
        },
        "layers": 2,
        "vllm_version": "0.33.0",
        "supported_vllm": SUPPORTS,
    }


def test_a_shim_that_forwards_each_hook_once_passes() -> None:
    problems, figures = judge(good_result())
    assert problems == []
    assert figures["dispatch_sites"] == {"reference": 10, "engine": 8}
    assert figures["frames_per_step"] == {"reference": [23, 23], "engine": [10, 10]}
    assert figures["hooks_per_step"] == [10, 10]
    assert figures["loads_verified"] == 4


def planted(change: str) -> dict[str, Any]:
    result = good_result()
    ours = result["engine"]["steps"][1]
    if change == "two-frames-in-a-hook":
        ours["codes"]["vllm_connector.py:45:ActiveKVConnector.wait_for_save"] = 2
        ours["frames"] += 1
    elif change == "engine-work-in-python":
        ours["codes"]["vllm_connector.py:45:ActiveKVConnector.wait_for_save"] = 0
        ours["codes"]["vllm_connector.py:60:_plan_stores"] = 1
    elif change == "nested-frames":
        ours["max_depth"] = 2
    elif change == "hook-not-served":
        ours["frames"] -= 2
        del ours["codes"]["vllm_connector.py:42:ActiveKVConnector.save_kv_layer"]
    elif change == "plans-differ":
        ours["stores"] = [[2000, 8]]
    elif change == "nothing-loaded":
        result["engine"]["events"]["loaded"] = 0
        result["reference"]["events"]["loaded"] = 0
    elif change == "wrong-bytes":
        ours["load_mismatches"] = 1
    return result


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("two-frames-in-a-hook", "engine step 1: 11 first-party Python frames for 10 hook calls"),
        ("engine-work-in-python", "engine step 1: engine work in Python: vllm_connector.py:60"),
        ("nested-frames", "engine step 1: first-party Python frames nest 2 deep"),
        ("hook-not-served", "engine step 1: 2 hook calls never reached the shim"),
        ("plans-differ", "step 1: the engine planned stores [[2000, 8]], the reference"),
        ("nothing-loaded", "the steps made no loads"),
        ("wrong-bytes", "engine steps [1]: loaded blocks differ from the stored bytes"),
    ],
)
def test_each_planted_violation_fails(change: str, expected: str) -> None:
    problems, _ = judge(planted(change))
    assert any(problem.startswith(expected) for problem in problems), problems


def has_vllm() -> bool:
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def test_without_vllm_the_gate_is_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("packaging")
    if has_vllm():
        pytest.skip("this interpreter has vLLM")
    monkeypatch.delenv("ACTIVEKV_VLLM_PYTHON", raising=False)
    wheel = build_wheel(tmp_path / "dist")
    evidence = run_served_path_gate(
        wheel_set(wheel), tmp_path / "out", pins=PINS, supports=SUPPORTS
    )
    assert evidence.verdict == "not-run"
    assert evidence.reason.startswith("not run for vLLM 0.32.0, 0.33.0: no Python 3.11+ with")
    assert dispatch_line(evidence.figures) == ""
    assert {pin: v["verdict"] for pin, v in evidence.figures["vllm_releases"].items()} == {
        "0.32.0": "not-run",
        "0.33.0": "not-run",
    }
    stored = read_evidence(tmp_path / "out", "served-path")
    assert stored is not None and stored.verdict == "not-run"
    assert json.loads((tmp_path / "out" / "evidence" / "served-path.json").read_text())[
        "artefacts"
    ] == {wheel.name: evidence.artefacts[wheel.name]}


def test_a_named_interpreter_without_vllm_is_an_error(tmp_path: Path) -> None:
    if has_vllm():
        pytest.skip("this interpreter has vLLM")
    wheel = build_wheel(tmp_path / "dist")
    with pytest.raises(GateError, match=r"--vllm-python .*: expected Python 3\.11\+ that imports"):
        run_served_path_gate(
            wheel_set(wheel), tmp_path / "out", pins=PINS, supports=SUPPORTS,
            vllm_pythons=[Path(sys.executable)],
        )  # fmt: skip


# --- the native core on duck-typed vLLM objects (no vLLM here; tests/with_vllm/ has the real ones)


@pytest.fixture(scope="module")
def native(activekv_site: Path) -> Iterator[Any]:
    """`activekv._vllm` imported from the built wheel. Without vLLM the shim cannot be imported;
    the core needs only its metadata class from it (build_connector_meta returns one), so a
    stand-in module provides that class for these duck-typed tests."""
    import activekv._vllm as module

    assert Path(module.__file__ or "").is_relative_to(activekv_site)
    if has_vllm():
        yield module
        return
    shim = types.ModuleType("activekv.vllm_connector")
    shim.ActiveKVMetadata = type("ActiveKVMetadata", (), {})  # type: ignore[attr-defined]
    sys.modules[shim.__name__] = shim
    try:
        yield module
    finally:
        del sys.modules[shim.__name__]


LAYERS = ["model.layers.0.attn", "model.layers.1.attn"]
BLOCK, HEADS, HEAD_DIM, BLOCKS = 4, 2, 8, 16


def fnv1a(data: bytes) -> int:
    key = 14695981039346656037
    for byte in data:
        key = ((key ^ byte) * 1099511628211) % 2**64
    return key


def configs(
    engine_id: str,
    *,
    device_type: str = "cpu",
    extra: dict[str, Any] | None = None,
    **spec_changes: Any,
) -> tuple[Any, Any]:
    spec = {"block_size": BLOCK, "num_kv_heads": HEADS, "head_size": HEAD_DIM,
            "head_size_v": HEAD_DIM, "dtype": "torch.float16", **spec_changes}  # fmt: skip
    extra = {"cpu_bytes": 1 << 20, "num_regions": 2, "region_blocks": 8, **(extra or {})}
    vllm_config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra, engine_id=engine_id),
        device_config=SimpleNamespace(device_type=device_type),
    )
    group = SimpleNamespace(layer_names=LAYERS, kv_cache_spec=SimpleNamespace(**spec))
    return vllm_config, SimpleNamespace(num_blocks=BLOCKS, kv_cache_groups=[group])


def request(request_id: str, hashes: list[bytes], num_tokens: int) -> Any:
    return SimpleNamespace(request_id=request_id, block_hashes=hashes, num_tokens=num_tokens)


def scheduled(new: list[tuple[str, list[int], int]], tokens: dict[str, int]) -> Any:
    cached = SimpleNamespace(
        req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]
    )
    return SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r, block_ids=(ids,), num_computed_tokens=c) for r, ids, c in new
        ],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=tokens,
        finished_req_ids=set(),
    )


def _metadata(plan: Any) -> Any:
    """`plan` (a StepPlan) as build_connector_meta hands it to vLLM: in the shim's metadata."""
    from activekv.vllm_connector import ActiveKVMetadata

    metadata = ActiveKVMetadata()
    metadata.plan = plan
    return metadata


def run_worker_step(worker: Any, plan: Any) -> None:
    """vLLM's worker calls for one step with a forward, as the served-path driver makes them;
    `plan` is the metadata build_connector_meta returned, or a StepPlan."""
    metadata = plan if hasattr(plan, "plan") else _metadata(plan)
    connector = SimpleNamespace(_get_connector_metadata=lambda: metadata)
    worker.start_load_kv(connector, None)
    for name in LAYERS:
        worker.wait_for_layer_load(connector, name)
        worker.save_kv_layer(connector, name, None, None)
    worker.wait_for_save(connector)


def test_core_stores_then_loads_blocks_byte_for_byte(native: Any) -> None:
    vllm_config, kv_cache_config = configs("duck-roundtrip")
    scheduler = native.ConnectorCore(
        vllm_config, SimpleNamespace(name="SCHEDULER"), kv_cache_config
    )
    worker = native.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)
    assert (scheduler.role, worker.role, worker.num_layers) == ("SCHEDULER", "WORKER", 2)
    rng = np.random.default_rng(5)
    kv = {name: rng.integers(0, 2**16, (2, BLOCKS, BLOCK, HEADS, HEAD_DIM), dtype=np.uint16)
          for name in LAYERS}  # fmt: skip
    worker.register_kv_caches(kv)
    hashes = [b"block-0", b"block-1", b"block-2"]

    # Step 1: request a computes 13 tokens; its three full blocks (3, 4, 5) are stored.
    first = request("a", hashes, 13)
    assert scheduler.get_num_new_matched_tokens(first, 0) == (0, False)
    scheduler.update_state_after_alloc(first, SimpleNamespace(), 0)
    plan = scheduler.build_connector_meta(scheduled([("a", [3, 4, 5, 6], 0)], {"a": 13})).plan
    assert plan.loads == []
    assert plan.stores == [(fnv1a(h), b) for h, b in zip(hashes, [3, 4, 5], strict=True)]
    restored = pickle.loads(pickle.dumps(plan))
    assert (restored.loads, restored.stores) == (plan.loads, plan.stores)
    run_worker_step(worker, restored)

    # Step 2: request b has the same prefix: all three blocks are offered and loaded into 9-11.
    second = request("b", hashes, 13)
    assert scheduler.get_num_new_matched_tokens(second, 0) == (12, False)
    scheduler.update_state_after_alloc(
        second, SimpleNamespace(get_block_ids=lambda: ([9, 10, 11, 12],)), 12
    )
    plan = scheduler.build_connector_meta(scheduled([("b", [9, 10, 11, 12], 12)], {"b": 1})).plan
    assert plan.loads == [(fnv1a(h), b) for h, b in zip(hashes, [9, 10, 11], strict=True)]
    assert plan.stores == []
    for layer in kv.values():
        layer[:, 9:12] = 0
    run_worker_step(worker, plan)
    for layer in kv.values():
        assert np.array_equal(layer[:, 9:12], layer[:, 3:6])
    assert worker.get_block_ids_with_load_errors() == set()
    counts = {**scheduler.event_counts}
    for kind, count in worker.event_counts.items():
        counts[kind] = counts.get(kind, 0) + count
    assert counts["commit"] == 3 and counts["loaded"] == 3 and counts["hit"] == 3


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"dtype": "torch.int8"}, "kv_cache_spec.dtype: expected torch.float16"),
        ({"head_size_v": 4}, "kv_cache_spec.head_size_v: expected the same as head_size"),
        ({"block_size": 0}, "kv_cache_spec.block_size: expected a positive 32-bit integer"),
        ({"num_kv_heads": None}, "kv_cache_spec.num_kv_heads: expected an integer; got nothing"),
    ],
)
def test_core_names_the_config_it_cannot_serve(
    native: Any, change: dict[str, Any], expected: str
) -> None:
    vllm_config, kv_cache_config = configs("duck-bad", **change)
    with pytest.raises(ValueError, match=re.escape(expected)):
        native.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("device", "gpu", 'device: expected "cpu" or "cuda"; got "gpu"'),
        ("mode", "int4", 'mode: expected "exact", "int8" or "fp8_e4m3"; got "int4"'),
        ("device", 1, "expected a string; got 1"),
    ],
)
def test_core_names_the_extra_config_key_it_cannot_use(
    native: Any, key: str, value: Any, expected: str
) -> None:
    vllm_config, kv_cache_config = configs("duck-extra", extra={key: value})
    with pytest.raises(
        ValueError, match=re.escape(f'kv_connector_extra_config["{key}"]: {expected}')
    ):
        native.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)


def gpu_present() -> bool:
    """A GPU that PyTorch (which holds the test's GPU KV caches) can use."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def test_core_on_a_cuda_vllm_takes_the_cuda_route(native: Any) -> None:
    """vLLM on GPUs (device_type "cuda") gets the CUDA route: without a GPU that is the CUDA
    route's construction error, never a silent fall back to host tensors."""
    if gpu_present():
        pytest.skip("a GPU is present: test_core_cuda_route_stores_then_loads covers it")
    vllm_config, kv_cache_config = configs("duck-cuda-nogpu", device_type="cuda")
    with pytest.raises(native.ConnectorConfigError, match=r'extra_config\["device"\] = "cuda": '
                       r"the CUDA route cannot start \(CUDA route: cuda"):  # fmt: skip
        native.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)
    # `device` overrides it: host tensors are taken (the CPU route), no GPU needed.
    vllm_config, kv_cache_config = configs("duck-cuda-host", device_type="cuda",
                                           extra={"device": "cpu"})  # fmt: skip
    worker = native.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)
    worker.register_kv_caches(
        {name: np.zeros((2, BLOCKS, BLOCK, HEADS, HEAD_DIM), dtype=np.uint16) for name in LAYERS}
    )


def test_core_cuda_route_stores_then_loads(native: Any) -> None:
    """GPU runners: the connector on GPU KV caches (torch tensors on cuda:0, stores ordered after
    the forward's stream) stores three blocks and loads them back into other blocks bit for bit;
    a host tensor is refused by name."""
    if not gpu_present():
        pytest.skip("not run: no GPU runner")
    import torch

    vllm_config, kv_cache_config = configs("duck-cuda", device_type="cuda")
    scheduler = native.ConnectorCore(
        vllm_config, SimpleNamespace(name="SCHEDULER"), kv_cache_config
    )
    worker = native.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)
    host = {name: torch.zeros((2, BLOCKS, BLOCK, HEADS, HEAD_DIM), dtype=torch.float16)
            for name in LAYERS}  # fmt: skip
    with pytest.raises(
        ValueError, match=re.escape(f'kv_caches["{LAYERS[0]}"]: expected an array on cuda:0')
    ):
        worker.register_kv_caches(host)
    generator = torch.Generator(device="cuda").manual_seed(5)
    kv = {name: torch.randn((2, BLOCKS, BLOCK, HEADS, HEAD_DIM), dtype=torch.float16,
                            device="cuda", generator=generator) for name in LAYERS}  # fmt: skip
    worker.register_kv_caches(kv)
    hashes = [b"gpu-0", b"gpu-1", b"gpu-2"]
    first = request("a", hashes, 13)
    scheduler.get_num_new_matched_tokens(first, 0)
    scheduler.update_state_after_alloc(first, SimpleNamespace(), 0)
    # The forward writes blocks 3-5 on its own stream just before the store hook: the store must
    # wait for it (it would copy the old values otherwise).
    forward = torch.cuda.Stream()
    expected = {name: torch.randn_like(layer[:, 3:6]) for name, layer in kv.items()}
    torch.cuda.synchronize()
    with torch.cuda.stream(forward):
        torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU time before the writes land
        for name, layer in kv.items():
            layer[:, 3:6].copy_(expected[name])
        run_worker_step(worker, scheduler.build_connector_meta(
            scheduled([("a", [3, 4, 5, 6], 0)], {"a": 13})))  # fmt: skip
    second = request("b", hashes, 13)
    assert scheduler.get_num_new_matched_tokens(second, 0) == (12, False)
    scheduler.update_state_after_alloc(
        second, SimpleNamespace(get_block_ids=lambda: ([9, 10, 11, 12],)), 12
    )
    plan = scheduler.build_connector_meta(scheduled([("b", [9, 10, 11, 12], 12)], {"b": 1})).plan
    for layer in kv.values():
        layer[:, 9:12] = 0
    torch.cuda.synchronize()
    run_worker_step(worker, plan)
    for name, layer in kv.items():
        assert torch.equal(layer[:, 9:12], expected[name])
    assert worker.get_block_ids_with_load_errors() == set()


def test_core_names_bad_worker_input(native: Any) -> None:
    vllm_config, kv_cache_config = configs("duck-worker")
    worker = native.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)
    good = np.zeros((2, BLOCKS, BLOCK, HEADS, HEAD_DIM), dtype=np.uint16)
    with pytest.raises(
        ValueError, match=re.escape(f"kv_caches: expected a tensor for layer {LAYERS[1]}")
    ):
        worker.register_kv_caches({LAYERS[0]: good})
    with pytest.raises(ValueError, match=re.escape(f'kv_caches["{LAYERS[1]}"]: expected shape')):
        worker.register_kv_caches({LAYERS[0]: good, LAYERS[1]: good[:, :8]})
    worker.register_kv_caches({name: good.copy() for name in LAYERS})
    wrong = SimpleNamespace(_get_connector_metadata=lambda: {"loads": []})
    with pytest.raises(ValueError, match="connector metadata: expected the ActiveKVMetadata"):
        worker.start_load_kv(wrong, None)
    empty = SimpleNamespace(_get_connector_metadata=lambda: _metadata(native.StepPlan()))
    with pytest.raises(ValueError, match="layer_name: expected a layer registered"):
        worker.wait_for_layer_load(empty, "model.layers.9.attn")


def test_core_offers_again_to_a_request_that_waited_a_step(native: Any) -> None:
    """An offer vLLM did not allocate for (the request stayed waiting) lapses at the step's end;
    asked again, the core offers the same blocks (the staging limit is not used up by it)."""
    vllm_config, kv_cache_config = configs("duck-waiting")
    scheduler = native.ConnectorCore(
        vllm_config, SimpleNamespace(name="SCHEDULER"), kv_cache_config
    )
    worker = native.ConnectorCore(vllm_config, SimpleNamespace(name="WORKER"), kv_cache_config)
    worker.register_kv_caches(
        {name: np.ones((2, BLOCKS, BLOCK, HEADS, HEAD_DIM), dtype=np.uint16) for name in LAYERS}
    )
    hashes = [b"w-0", b"w-1", b"w-2"]
    scheduler.get_num_new_matched_tokens(request("a", hashes, 13), 0)
    plan = scheduler.build_connector_meta(scheduled([("a", [1, 2, 3, 4], 0)], {"a": 13})).plan
    run_worker_step(worker, plan)
    waiting = request("b", hashes, 13)
    for _ in range(3):  # offered, not allocated, step ends; asked again next step
        assert scheduler.get_num_new_matched_tokens(waiting, 0) == (12, False)
        assert scheduler.build_connector_meta(scheduled([], {})).plan.loads == []


def test_the_shared_shim_is_named_by_digest_with_every_wheel_that_carries_it(
    tmp_path: Path,
) -> None:
    """The gate judges the shim in one wheel and vouches for it in all: its evidence names the
    shim's digest and the wheels that carry it, and a wheel without it, or with other bytes,
    is a problem (the negative controls)."""
    shim = SHIM_PATH
    same = {shim: b"# the shim\n"}
    a = build_files_wheel(tmp_path / "a", same, name="activekv", version="0.1.0",
                          tag="cp311-cp311-manylinux_2_28_x86_64")  # fmt: skip
    b = build_files_wheel(tmp_path / "b", same, name="activekv", version="0.1.0",
                          tag="cp312-abi3-manylinux_2_28_x86_64")  # fmt: skip
    figure, problems = shared_file(wheel_set(a, b))
    assert problems == []
    assert figure == {"path": shim, "sha256": hashlib.sha256(same[shim]).hexdigest(),
                      "carried_by": sorted([a.name, b.name])}  # fmt: skip
    other = build_files_wheel(tmp_path / "c", {shim: b"# other bytes\n"}, name="activekv",
                              version="0.1.0", tag="cp310-cp310-manylinux_2_28_x86_64")  # fmt: skip
    figure, problems = shared_file(wheel_set(a, other))
    assert figure["sha256"] == "differs"
    assert problems == [f"{shim} differs between wheels: " + str({
        a.name: hashlib.sha256(same[shim]).hexdigest(),
        other.name: hashlib.sha256(b"# other bytes\n").hexdigest()})]  # fmt: skip
    bare = build_files_wheel(tmp_path / "d", {"activekv/py.typed": b""}, name="activekv",
                             version="0.1.0", tag="cp310-cp310-manylinux_2_28_x86_64")  # fmt: skip
    assert shared_file(wheel_set(a, bare))[1] == [f"{bare.name}: carries no {shim}"]


# --- the driver's result comes only from its report file, never from stdout


def planted_driver(path: Path, body: str) -> Path:
    """A stand-in for served_path_driver.py taking its arguments and running `body` (RESULT is
    a good driver result, REPORT the report path)."""
    path.write_text(
        "import argparse, atexit, json\n"
        "from pathlib import Path\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--report', type=Path, required=True)\n"
        "REPORT = parser.parse_known_args()[0].report\n"
        f"RESULT = {json.dumps(good_result())!r}\n" + body
    )
    return path


@pytest.fixture
def driven_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The gate run with this interpreter as vLLM's, on a wheel for it carrying the shim."""
    from packaging.tags import sys_tags

    from release.gates import served_path

    tags = [str(tag) for tag in sys_tags()]
    here = VllmPython(Path(sys.executable), "0.33.0", tags)
    monkeypatch.setattr(served_path, "vllm_interpreters", lambda _: [here])
    return build_files_wheel(
        tmp_path / "dist", {SHIM_PATH: b"# the shim\n"}, name="activekv", version="0.1.0",
        tag=f"cp{sys.version_info.major}{sys.version_info.minor}-none-any",
    )  # fmt: skip


@pytest.mark.integration  # pip installs the wheel for the driver
@pytest.mark.parametrize(
    ("body", "verdict", "reason"),
    [
        # A plugin printing at exit: the report is judged, the noise is not parsed.
        (
            "atexit.register(print, 'plugin: goodbye')\nprint(RESULT)\nREPORT.write_text(RESULT)\n",
            "pass",
            "",
        ),
        # Exit 0, nothing printed, no report.
        ("", "fail", "the driver exited 0 without writing its report served-path.json; stdout: ''"),
        # Exit 0 with a result on stdout only: not a report.
        ("print(RESULT)\n", "fail", "the driver exited 0 without writing its report"),
        (
            "print('half')\nREPORT.write_text(RESULT[:40])\n",
            "fail",
            "expected a JSON report from the driver, served-path.json is not",
        ),
        (
            "REPORT.write_text('[]')\n",
            "fail",
            'expected a report {"engine": {...}, "reference": {...}} from the driver',
        ),
        (
            "REPORT.write_text(json.dumps({'engine': {}, 'reference': {}}))\n",
            "fail",
            "the driver's report lacks what the judgement reads (KeyError('steps'))",
        ),
    ],
)
def test_the_verdict_comes_from_the_drivers_report(
    driven_here: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    verdict: str,
    reason: str,
) -> None:
    from release.gates import served_path

    monkeypatch.setattr(served_path, "DRIVER", planted_driver(tmp_path / "driver.py", body))
    evidence = run_served_path_gate(
        wheel_set(driven_here), tmp_path / "out", pins=["0.33.0"], supports=SUPPORTS
    )
    assert evidence.verdict == verdict, evidence.reason
    assert evidence.reason.startswith(f"vLLM 0.33.0: {reason}" if reason else ""), evidence.reason


def test_the_driver_writes_its_report_whole(tmp_path: Path) -> None:
    from release.scripts.served_path_driver import write_report

    report = tmp_path / "served-path.json"
    write_report(report, good_result())
    assert json.loads(report.read_text()) == good_result()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served-path.json"]


def test_an_interpreter_that_prints_before_the_probe_is_judged_not_crashed(tmp_path: Path) -> None:
    """A .pth or sitecustomize may print at start: the probe's answer is its last line."""
    noisy = tmp_path / "python-noisy"
    noisy.write_text(f'#!/bin/sh\necho "hello from a .pth"\nexec {sys.executable} "$@"\n')
    noisy.chmod(0o755)
    has_vllm = importlib.util.find_spec("vllm") is not None and sys.version_info >= (3, 11)
    if has_vllm:
        assert vllm_interpreters([noisy])[0].python == noisy
    else:
        with pytest.raises(GateError, match=r"expected Python 3.11\+ that imports vllm"):
            vllm_interpreters([noisy])


def fake_vllm_python(path: Path, version: str) -> Path:
    """An "interpreter" that answers the gate's probe as one with vLLM `version` would."""
    answer = json.dumps({"ok": True, "vllm": version, "tags": ["py3-none-any"]})
    path.write_text(f"#!/bin/sh\necho '{answer}'\n")
    path.chmod(0o755)
    return path


def test_each_pinned_release_gets_the_interpreter_that_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACTIVEKV_VLLM_PYTHON holds several interpreters; a vLLM's local label does not count,
    another patch release does not stand in for the pinned one."""
    old = fake_vllm_python(tmp_path / "python-032", "0.32.0+cpu")
    patch = fake_vllm_python(tmp_path / "python-0331", "0.33.1")
    monkeypatch.setenv("ACTIVEKV_VLLM_PYTHON", f"{old}{os.pathsep}{patch}")
    found = vllm_interpreters()
    assert [f.python for f in found][:2] == [old, patch]
    chosen = for_pins(found, PINS)
    assert chosen["0.32.0"] is not None and chosen["0.32.0"].python == old
    assert chosen["0.33.0"] is None


def test_a_pinned_release_no_interpreter_has_is_not_run_naming_it(
    driven_here: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.33.0 is judged (and passes); 0.32.0 is not: the verdict is "not-run", never "pass"."""
    from release.gates import served_path

    body = "REPORT.write_text(RESULT)\n"
    monkeypatch.setattr(served_path, "DRIVER", planted_driver(tmp_path / "driver.py", body))
    monkeypatch.setattr(served_path, "install_private", lambda *_: tmp_path)
    evidence = run_served_path_gate(wheel_set(driven_here), tmp_path / "out", pins=PINS,
                                    supports=SUPPORTS)  # fmt: skip
    assert evidence.verdict == "not-run"
    assert evidence.reason.startswith("not run for vLLM 0.32.0: no Python 3.11+ with that vLLM")
    assert evidence.reason.endswith("(judged: 0.33.0 pass)")
    assert evidence.figures["vllm_releases"]["0.33.0"]["verdict"] == "pass"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("supported_vllm", ">=0.32,<0.35", "the wheel's activekv._vllm.SUPPORTED_VLLM is "
         "'>=0.32,<0.35', but the manifest's shim supports '>=0.32,<0.34' (payload.shims)"),
        ("vllm_version", "0.32.0", "the driver ran under vLLM '0.32.0', not the pinned 0.33.0"),
    ],
)  # fmt: skip
def test_a_wheel_or_vllm_other_than_the_manifests_fails(
    driven_here: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str,
    expected: str,
) -> None:  # fmt: skip
    from release.gates import served_path

    body = f"result = json.loads(RESULT)\nresult[{key!r}] = {value!r}\n"
    body += "REPORT.write_text(json.dumps(result))\n"
    monkeypatch.setattr(served_path, "DRIVER", planted_driver(tmp_path / "driver.py", body))
    monkeypatch.setattr(served_path, "install_private", lambda *_: tmp_path)
    evidence = run_served_path_gate(
        wheel_set(driven_here), tmp_path / "out", pins=["0.33.0"], supports=SUPPORTS
    )
    assert evidence.verdict == "fail"
    assert evidence.reason == f"vLLM 0.33.0: {expected}"
