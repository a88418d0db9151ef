"""kv_transfer_config.kv_connector_extra_config and the KV cache config, as a user writes them:
every mistake is refused when vLLM creates the connector, naming the key or field and what was
expected, before anything is allocated."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from release.scripts.served_path_driver import build_configs

EXTRA = "kv_transfer_config.kv_connector_extra_config"
_ids = itertools.count()


def _create(tmp_path: Path, extra: dict[str, Any], **options: Any) -> Any:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    folder = tmp_path / f"model-{next(_ids)}"
    folder.mkdir()
    vllm_config, kv_cache_config, *_ = build_configs(
        folder, "ActiveKVConnector", None, 2, extra=extra, **options
    )
    # A fresh engine id per case: the scheduler and worker halves of one id share an engine.
    vllm_config.kv_transfer_config.engine_id = f"config-case-{next(_ids)}"
    return KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)


def _worker_role() -> Any:
    """vLLM's KVConnectorRole.WORKER: the core refuses any other kind of role (a string too)."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole

    return KVConnectorRole.WORKER


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"mdoe": "int8"}, f'{EXTRA}["mdoe"]: unknown key (did you mean "mode"?); expected one '
         "of mode, device, cpu_bytes, num_regions, region_blocks"),
        ({"pool": 1}, f'{EXTRA}["pool"]: unknown key; expected one of mode'),
        ({"mode": "int4"}, f'{EXTRA}["mode"]: mode: expected "exact", "int8" or "fp8_e4m3"; '
         'got "int4"'),
        ({"mode": 8}, f'{EXTRA}["mode"]: expected a string; got 8'),
        ({"cpu_bytes": 16}, f'{EXTRA}["cpu_bytes"]: expected room for at least one slot of '),
        ({"cpu_bytes": 2**50}, f'{EXTRA}["cpu_bytes"]: expected a pool that fits in this '
         "machine's memory"),
        ({"cpu_bytes": "1G"}, f"{EXTRA}\\[\"cpu_bytes\"\\]: expected a positive integer"),
        ({"cpu_bytes": True}, f'{EXTRA}["cpu_bytes"]: expected a positive integer below 2**63; '
         "got True"),
        ({"num_regions": 0}, f'{EXTRA}["num_regions"]: expected a positive integer'),
        ({"region_blocks": -3}, f'{EXTRA}["region_blocks"]: expected a positive integer'),
        ({"device": "tpu"}, f'{EXTRA}["device"]: device: expected "cpu" or "cuda"; got "tpu"'),
        ({"device": "cuda"}, f'{EXTRA}["device"] = "cuda": the CUDA route cannot start ('),
    ],
)  # fmt: skip
def test_a_bad_setting_is_refused_naming_its_key(
    activekv_site: Path, tmp_path: Path, extra: dict[str, Any], message: str
) -> None:
    import activekv._vllm as native

    text = message if message.startswith(EXTRA + "\\") else re.escape(message)
    with pytest.raises(native.ConnectorConfigError, match=text):
        _create(tmp_path, extra)


@pytest.mark.parametrize("spelling", ["fp8", "fp8_e4m3"])
def test_fp8_is_taken_as_fp8_e4m3(activekv_site: Path, tmp_path: Path, spelling: str) -> None:
    connector = _create(tmp_path, {"mode": spelling, "cpu_bytes": 1 << 22})
    assert connector._core.num_layers == 2


def test_zero_or_several_kv_cache_groups_are_refused_saying_why(
    activekv_site: Path, tmp_path: Path
) -> None:
    import activekv._vllm as native
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    from_config = _create(tmp_path, {"cpu_bytes": 1 << 22})
    assert from_config._core.num_layers == 2
    folder = tmp_path / "groups"
    folder.mkdir()
    vllm_config, kv_cache_config, names, spec, _ = build_configs(
        folder, "ActiveKVConnector", None, 2
    )
    window = SlidingWindowSpec(block_size=spec.block_size, num_kv_heads=spec.num_kv_heads,
                               head_size=spec.head_size, dtype=spec.dtype,
                               sliding_window=64)  # fmt: skip
    cases = {
        "none (a model without a KV cache has nothing to offload)": [],
        "2 (FullAttentionSpec, SlidingWindowSpec). Layers of several attention kinds": [
            KVCacheGroupSpec(names[:1], spec), KVCacheGroupSpec(names[1:], window)],
    }  # fmt: skip
    for expected, groups in cases.items():
        config = KVCacheConfig(num_blocks=kv_cache_config.num_blocks, kv_cache_tensors=[],
                               kv_cache_groups=groups)  # fmt: skip
        with pytest.raises(native.ConnectorConfigError, match=re.escape(expected)):
            native.ConnectorCore(vllm_config, _worker_role(), config)


def test_a_spec_with_quantised_kv_is_refused_naming_the_field(
    activekv_site: Path, tmp_path: Path
) -> None:
    import dataclasses

    import activekv._vllm as native
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVQuantMode

    folder = tmp_path / "quantised"
    folder.mkdir()
    vllm_config, kv_cache_config, names, spec, _ = build_configs(
        folder, "ActiveKVConnector", None, 2
    )
    quantised = dataclasses.replace(spec, kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD)
    config = KVCacheConfig(num_blocks=kv_cache_config.num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(names, quantised)])  # fmt: skip
    with pytest.raises(native.ConnectorConfigError, match=r"kv_cache_spec\.kv_quant_mode: "
                       r"expected the plain K and V of FullAttentionSpec"):  # fmt: skip
        native.ConnectorCore(vllm_config, _worker_role(), config)


@pytest.mark.parametrize("role", ["scheduler", "SCHEDULER", "WORKER", 0, 1, None])
def test_a_role_that_is_not_vllms_kv_connector_role_is_refused(
    activekv_site: Path, tmp_path: Path, role: Any
) -> None:
    """The string "scheduler" (or an int, None) was taken for a worker: refused, naming role,
    through the shim as vLLM's factory builds it."""
    import activekv._vllm as native
    from activekv.vllm_connector import ActiveKVConnector
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    folder = tmp_path / "role"
    folder.mkdir()
    vllm_config, kv_cache_config, *_ = build_configs(folder, "ActiveKVConnector", None, 2)
    expected = ("role: expected vLLM's KVConnectorRole.SCHEDULER or KVConnectorRole.WORKER; got "
                f"{role!r} ({type(role).__name__})")  # fmt: skip
    with pytest.raises(native.ConnectorConfigError, match=f"^{re.escape(expected)}$"):
        ActiveKVConnector(vllm_config, role, kv_cache_config)


def test_a_second_worker_of_one_engine_id_with_another_pool_is_refused(
    activekv_site: Path, tmp_path: Path
) -> None:
    """It silently got the first engine's pool; an identical config still shares the engine."""
    import activekv._vllm as native
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    engine_id = f"config-shared-{next(_ids)}"
    made = []
    for cpu_bytes in (1 << 22, 1 << 22, 1 << 23):
        folder = tmp_path / f"shared-{next(_ids)}"
        folder.mkdir()
        vllm_config, kv_cache_config, *_ = build_configs(
            folder, "ActiveKVConnector", None, 2, extra={"cpu_bytes": cpu_bytes}
        )
        vllm_config.kv_transfer_config.engine_id = engine_id
        create = KVConnectorFactory.create_connector
        if cpu_bytes == 1 << 22:
            made.append(create(vllm_config, KVConnectorRole.WORKER, kv_cache_config))
            continue
        expected = (f'{EXTRA}["cpu_bytes"]: expected {1 << 22} (the engine "{engine_id}" of this '
                    f"process already runs with it); got {1 << 23}")  # fmt: skip
        with pytest.raises(native.ConnectorConfigError, match=f"^{re.escape(expected)}$"):
            create(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    assert len(made) == 2
