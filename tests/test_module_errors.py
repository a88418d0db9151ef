"""Each native module translates its own C++ exceptions, whichever module was imported first.

Every module links its own copy of the C++ runtime, so nanobind's built-in translator (living in
the first module imported) cannot match another module's std::invalid_argument; before each
module registered its own, `_fabric`'s argument errors became "exception could not be translated"
once `_engine` had been imported. `_vllm` raises the KV tensors it refuses as `_engine`'s own
EngineInputError and a hook out of order as `_engine`'s own EngineStateError (bindings/kv_views.h),
whichever was imported first. Each order runs in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from itertools import permutations
from pathlib import Path

import pytest

PROBE = """
import importlib, sys
sys.path.insert(0, {site!r})
for name in {order!r}:
    importlib.import_module(name)
import activekv._engine as engine, activekv._fabric as fabric
raised = []
try:
    fabric.DecodeWorker(["libc.so.6"], executor_mixing="sideways")
except Exception as error:
    raised.append(type(error).__name__)
try:
    engine.Engine(engine.KvBlockLayout(1, 1, 1, 8, engine.KvDtype.bf16), "exact", 1 << 20,
                  1, 1, 1, device="tpu")
except Exception as error:
    raised.append(type(error).__name__ + ":" + str(isinstance(error, ValueError)))
# A KV tensor the connector core refuses: _engine's EngineInputError, as the engine raises it.
from types import SimpleNamespace as NS
import numpy as np
import activekv._vllm as vllm
spec = NS(block_size=1, num_kv_heads=1, head_size=8, head_size_v=8, dtype="torch.bfloat16")
config = NS(kv_transfer_config=NS(engine_id="probe", kv_connector_extra_config={{
    "cpu_bytes": 1 << 20, "num_regions": 1, "region_blocks": 1}}), device_config=None)
core = vllm.ConnectorCore(config, NS(name="WORKER"), NS(
    num_blocks=1, kv_cache_groups=[NS(layer_names=["l0"], kv_cache_spec=spec)]))
try:
    core.register_kv_caches({{"l0": np.zeros((2, 1, 1, 1, 8), np.float16)}})
except Exception as error:
    raised.append(type(error).__name__ + ":" + str(type(error) is engine.EngineInputError))
# A hook out of order (no KV caches registered): _engine's EngineStateError, as the engine raises.
shim = NS(_get_connector_metadata=lambda: NS(plan=vllm.StepPlan()))
try:
    core.start_load_kv(shim, None)
except Exception as error:
    raised.append(type(error).__name__ + ":" + str(type(error) is engine.EngineStateError))
print(raised)
"""


@pytest.mark.parametrize(
    "order", list(permutations(("activekv._engine", "activekv._fabric", "activekv._vllm")))
)
def test_argument_errors_are_value_errors_in_any_import_order(
    engine_site: Path, order: tuple[str, ...]
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(site=str(engine_site), order=order)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == (
        "['ValueError', 'EngineInputError:True', 'EngineInputError:True', 'EngineStateError:True']"
    ), result.stdout
