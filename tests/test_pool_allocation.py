"""A host pool that passes the argument checks (it fits this machine's memory) but cannot be
allocated is one line naming the pool's size, what was asked and why: activekv._engine's
EngineInputError from Engine(...), the connector's ConnectorConfigError naming
kv_connector_extra_config["cpu_bytes"] from a worker ConnectorCore. It was a plain ValueError of
the pool's own type (HostPoolError) that said neither why nor as which argument.

Each case runs in a child process under an address-space limit (RLIMIT_AS) a little above what
the child maps already, so the pool (4 GiB, below this machine's memory) cannot be mapped.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_connector_worker import configs

POOL = 4 << 30  # below the machine's memory (the argument checks pass), above the limit below
HEADROOM = 256 << 20

# Limits the child's address space to what it maps now plus HEADROOM.
LIMIT = f"""
import os, resource
mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGESIZE")
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
soft = mapped + {HEADROOM}
if hard != resource.RLIM_INFINITY:
    soft = min(soft, hard)
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
"""  # fmt: skip

ENGINE = f"""
import activekv._engine as engine
layout = engine.KvBlockLayout(4, 16, 8, 64, engine.KvDtype.fp16)
slot = engine.stored_block_bytes(layout, "exact")
print(slot)
{LIMIT}
try:
    engine.Engine(layout, "exact", {POOL}, 4, 16, 64)
except engine.EngineInputError as error:
    print("EngineInputError", error)
except BaseException as error:
    print(type(error).__name__, error)
else:
    print("allocated")
"""

CONNECTOR = (
    "from types import SimpleNamespace as NS\nfrom typing import Any\n"
    + inspect.getsource(configs)
    + f"""
import activekv._engine as engine
import activekv._vllm as vllm
config, kv_cache_config = configs("pool-alloc", blocks=64, block=16, heads=8, head_dim=64,
                                  layers=["l0", "l1"], region_blocks=16, cpu_bytes={POOL})
{LIMIT}
try:
    vllm.ConnectorCore(config, NS(name="WORKER"), kv_cache_config)
except vllm.ConnectorConfigError as error:
    print("ConnectorConfigError", error)
except BaseException as error:
    print(type(error).__name__, error)
else:
    print("allocated")
"""
)


def _child(site: Path, script: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", f"import sys\nsys.path.insert(0, {str(site)!r})\n{script}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    return result.stdout.splitlines()


def _asked(slot: int) -> int:
    """The bytes the pool asks for: whole slots, rounded up to 4 KiB pages."""
    return (POOL // slot * slot + 4095) // 4096 * 4096


@pytest.fixture(scope="module")
def site(engine_site: Path) -> Path:
    if not Path("/proc/self/statm").exists():
        pytest.skip("needs /proc/self/statm to set an address-space limit")
    return engine_site


def test_an_engine_pool_that_cannot_be_allocated_is_an_engine_input_error(site: Path) -> None:
    slot, outcome = _child(site, ENGINE)
    asked = _asked(int(slot))
    assert outcome == (
        f"EngineInputError capacity_bytes: cannot allocate {asked} bytes of page-aligned host "
        "memory (aligned_alloc: Cannot allocate memory)"
    )


def test_a_connector_pool_that_cannot_be_allocated_names_cpu_bytes(site: Path) -> None:
    (outcome,) = _child(site, CONNECTOR)
    # 2 layers of 16 tokens x 8 heads x 64 fp16, K and V: 65536-byte slots, POOL divides evenly.
    assert outcome == (
        'ConnectorConfigError kv_transfer_config.kv_connector_extra_config["cpu_bytes"]: cannot '
        f"allocate {_asked(65536)} bytes of page-aligned host memory (aligned_alloc: Cannot "
        "allocate memory)"
    )


def test_a_cuda_region_that_cannot_be_allocated_names_region_blocks(engine_module: Any) -> None:
    """The CUDA route's buffers are sized by the engine's arguments: a region's device staging
    buffer no GPU holds (8 Mi blocks of 128 KiB layers, 1 TiB) is an EngineInputError naming
    region_blocks, not the route's RuntimeError (CudaRouteError)."""
    from release.gpu import detect_gpu

    if detect_gpu() is None:
        pytest.skip("no GPU runner: the CUDA route cannot start here")
    native = engine_module
    layout = native.KvBlockLayout(1, 16, 8, 128, native.KvDtype.fp32)
    slot = native.stored_block_bytes(layout, "exact")
    with pytest.raises(native.EngineInputError) as refused:
        native.Engine(layout, "exact", 4 * slot, 1, 1 << 23, 4, device="cuda")
    assert str(refused.value) == (
        f"region_blocks: cannot allocate {(1 << 23) * slot} bytes of device memory "
        "(cudaMalloc: out of memory)"
    )
