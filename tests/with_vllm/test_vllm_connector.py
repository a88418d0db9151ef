"""ActiveKV's connector inside the real vLLM: plugin, factory, both roles, the gates.

Runs under `nox -s vllm` (vLLM 0.33.0 installed, CPU only); it passes under 0.32.0 too. Nothing
here is a stand-in: the plugin loader, the factory, the Scheduler and the connector base class are
vLLM's own.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fixtures_wheels import wheel_set

from release.gates.payload import run_payload_gate
from release.gates.served_path import run_served_path_gate
from release.manifest import load_manifest
from release.scripts.served_path_driver import build_configs

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "manifests" / "activekv.toml"
SHIM = "activekv/vllm_connector.py"


@pytest.fixture(scope="module")
def configs(activekv_site: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    vllm_config, kv_cache_config, *_ = build_configs(
        tmp_path_factory.mktemp("model"), "ActiveKVConnector", None, layers=3
    )
    return vllm_config, kv_cache_config


def test_this_vllm_is_a_supported_release_and_the_range_is_the_manifests(
    activekv_site: Path,
) -> None:
    import vllm
    from activekv import _vllm

    (shim,) = load_manifest(MANIFEST).payload.shims
    assert _vllm.SUPPORTED_VLLM == shim.supports
    assert _vllm.vllm_version_supported(vllm.__version__)
    assert vllm.__version__ in [pin.version for pin in shim.versions]


def printed_in_a_fresh_interpreter(site: Path, script: str) -> list[str]:
    """The lines `script` prints, run by this interpreter with the wheel's folder on its path
    (so vLLM's plugin loader finds the entry point) and nothing imported yet."""
    env = {**os.environ, "PYTHONPATH": str(site), "VLLM_TARGET_DEVICE": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    return result.stdout.strip().splitlines()


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0rc1"])  # the rule itself: test_vllm_release
def test_a_vllm_outside_the_range_is_refused_at_plugin_load_in_one_line(
    activekv_site: Path, version: str
) -> None:
    """vLLM's own plugin loader calls the entry point, which refuses before registering
    anything; a connector made without the plugin (kv_connector_module_path) is refused too."""
    script = (
        "import vllm\n"
        f"vllm.__version__ = {version!r}\n"
        "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory as F\n"
        "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole\n"
        "from vllm.plugins import load_general_plugins\n"
        "from activekv import _vllm\n"
        "for call in (load_general_plugins,\n"
        "             lambda: _vllm.ConnectorCore(object(), KVConnectorRole.WORKER, object())):\n"
        "    try:\n"
        "        call()\n"
        "        print('accepted')\n"
        "    except _vllm.UnsupportedVllmError as error:\n"
        "        print(repr(str(error)))\n"
        "print('ActiveKVConnector' in F._registry)\n"
    )
    *refusals, registered = printed_in_a_fresh_interpreter(activekv_site, script)[-3:]
    expected = (
        "activekv's ActiveKVConnector supports vLLM >=0.32,<0.34 (0.32.x and 0.33.x); this is "
        f"vLLM {version}"
    )
    assert refusals == [repr(expected)] * 2
    assert registered == "False"


def test_load_general_plugins_calls_our_entry_point(activekv_site: Path) -> None:
    """In a fresh interpreter: not registered before vLLM loads its plugins, registered after."""
    script = (
        "from importlib.metadata import entry_points\n"
        "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory as F\n"
        "from vllm.plugins import load_general_plugins\n"
        "eps = [e.value for e in entry_points(group='vllm.general_plugins')]\n"
        "ours = eps.count('activekv._vllm:register_connector')\n"
        "before = 'ActiveKVConnector' in F._registry\n"
        "load_general_plugins()\n"
        "print(ours, before, 'ActiveKVConnector' in F._registry)\n"
    )
    assert printed_in_a_fresh_interpreter(activekv_site, script)[-1] == "1 False True"


def test_registration_is_idempotent(configs: tuple[Any, Any]) -> None:
    import activekv._vllm as native
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    loader = KVConnectorFactory._registry["ActiveKVConnector"]
    assert native.register_connector() is False  # already registered: checked, not raised
    assert KVConnectorFactory._registry["ActiveKVConnector"] is loader


def test_the_factory_returns_our_class(configs: tuple[Any, Any], activekv_site: Path) -> None:
    from activekv.vllm_connector import ActiveKVConnector
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    vllm_config, _ = configs
    assert KVConnectorFactory.get_connector_class_by_name("ActiveKVConnector") is ActiveKVConnector
    assert KVConnectorFactory.get_connector_class(vllm_config.kv_transfer_config) is (
        ActiveKVConnector
    )
    module = sys.modules[ActiveKVConnector.__module__]
    assert Path(module.__file__ or "").resolve() == (activekv_site / SHIM).resolve()


@pytest.mark.parametrize("role", ["SCHEDULER", "WORKER"])
def test_create_connector_builds_both_roles(configs: tuple[Any, Any], role: str) -> None:
    from activekv._vllm import ConnectorCore
    from activekv.vllm_connector import ActiveKVConnector
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    vllm_config, kv_cache_config = configs
    connector = KVConnectorFactory.create_connector(
        vllm_config, KVConnectorRole[role], kv_cache_config
    )
    assert type(connector) is ActiveKVConnector
    assert isinstance(connector, KVConnectorBase_V1)
    assert connector.role is KVConnectorRole[role]
    assert isinstance(connector._core, ConnectorCore)
    assert connector._core.role == role
    assert connector._core.num_layers == 3


def test_every_abstract_method_is_implemented_by_the_shim() -> None:
    from activekv.vllm_connector import ActiveKVConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    abstract = KVConnectorBase_V1.__abstractmethods__
    assert abstract >= {"start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                        "get_num_new_matched_tokens", "update_state_after_alloc",
                        "build_connector_meta"}  # fmt: skip
    assert ActiveKVConnector.__abstractmethods__ == frozenset()
    assert all(name in vars(ActiveKVConnector) for name in abstract)


def test_metadata_from_a_real_scheduler_pickles(configs: tuple[Any, Any]) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    vllm_config, kv_cache_config = configs
    block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
    scheduler = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
    )
    init_none_hash(sha256)
    scheduler.add_request(
        Request(
            request_id="pickled",
            prompt_token_ids=list(range(3 * block_size + 1)),
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            block_hasher=get_request_block_hasher(block_size, sha256),
        )
    )
    metadata = scheduler.schedule().kv_connector_metadata
    assert isinstance(metadata, KVConnectorMetadata)  # build_connector_meta's declared type
    plan = metadata.plan
    assert len(plan.stores) == 3  # the three full blocks of the prompt
    copy = pickle.loads(pickle.dumps(metadata))
    assert type(copy) is type(metadata)
    assert (copy.plan.loads, copy.plan.stores) == (plan.loads, plan.stores)


def test_payload_audit_verifies_the_shim_against_the_vllm_wheel(
    built_wheel: Path, tmp_path: Path, framework_cache: Path
) -> None:
    evidence = run_payload_gate(
        load_manifest(MANIFEST),
        wheel_set(built_wheel),
        tmp_path / "out",
        framework_cache=framework_cache,
    )
    assert evidence.verdict == "pass", evidence.reason


def test_payload_audit_catches_a_wrong_line_number_against_vllm(
    built_wheel: Path, tmp_path: Path, framework_cache: Path
) -> None:
    with zipfile.ZipFile(built_wheel) as archive:
        shim = archive.read(SHIM)
    changed = re.sub(rb"base\.py:181 ", b"base.py:182 ", shim, count=1)
    assert changed != shim
    wheel = rewrite_shim(built_wheel, tmp_path / "dist", changed)
    manifest_path = tmp_path / "activekv.toml"
    manifest_path.write_text(
        MANIFEST.read_text().replace(
            hashlib.sha256(shim).hexdigest(), hashlib.sha256(changed).hexdigest()
        )
    )
    evidence = run_payload_gate(
        load_manifest(manifest_path),
        wheel_set(wheel),
        tmp_path / "out",
        framework_cache=framework_cache,
    )
    assert evidence.verdict == "fail"
    line = 1 + shim[: shim.index(b"base.py:181 ")].count(b"\n")
    cited = "vllm/distributed/kv_transfer/kv_connector/v1/base.py:182"
    assert f"{SHIM}: line {line}: cites {cited}" in evidence.reason
    assert "the cited text is at line 181 (wrong line number)" in evidence.reason


def this_vllm() -> dict[str, Any]:
    """The served-path gate's arguments for judging under this interpreter's vLLM alone."""
    from vllm import __version__

    (shim,) = load_manifest(MANIFEST).payload.shims
    return {
        "pins": [__version__],
        "supports": shim.supports,
        "vllm_pythons": [Path(sys.executable)],
    }


def test_served_path_gate_passes_on_the_built_wheel(built_wheel: Path, tmp_path: Path) -> None:
    evidence = run_served_path_gate(wheel_set(built_wheel), tmp_path / "out", **this_vllm())
    assert evidence.verdict == "pass", evidence.reason
    (judged,) = evidence.figures["vllm_releases"].values()
    assert judged["verdict"] == "pass" and judged["python"] == sys.executable
    sites = evidence.figures["dispatch_sites"]
    assert sites["engine"] <= 9 < sites["reference"]  # only the shim's hook methods ran
    assert evidence.figures["loads_verified"] > 0
    assert evidence.figures["frames_per_step"]["engine"] == evidence.figures["hooks_per_step"]


def test_served_path_gate_fails_on_a_shim_that_works_in_python(
    built_wheel: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(built_wheel) as archive:
        shim = archive.read(SHIM)
    planted = (
        shim.replace(
            b"return self._core.wait_for_save(self)",
            b"return _forward(self._core.wait_for_save, self)",
        )
        + b"\n\ndef _forward(hook, *args):\n    return hook(*args)\n"
    )
    wheel = rewrite_shim(built_wheel, tmp_path / "dist", planted)
    evidence = run_served_path_gate(wheel_set(wheel), tmp_path / "out", **this_vllm())
    assert evidence.verdict == "fail"
    assert "first-party Python frames for" in evidence.reason
    assert "engine work in Python: vllm_connector.py:" in evidence.reason
    assert "_forward ran" in evidence.reason


@pytest.fixture(scope="session")
def framework_cache() -> Path:
    """Where vLLM's wheel is kept for citation checks: shared with the release's cache."""
    return Path(os.environ.get("ACTIVEKV_CACHE_DIR") or REPO / ".activekv" / "cache")


def rewrite_shim(wheel: Path, dest: Path, shim: bytes) -> Path:
    """A copy of `wheel` (same name) whose shim is `shim`."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w") as out:
        for item in source.infolist():
            out.writestr(item, shim if item.filename == SHIM else source.read(item))
    return target
