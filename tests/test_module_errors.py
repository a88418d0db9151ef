"""Each native module translates its own C++ exceptions, whichever module was imported first.

Every module links its own copy of the C++ runtime, so nanobind's built-in translator (living in
the first module imported) cannot match another module's std::invalid_argument; before each
module registered its own, `_fabric`'s argument errors became "exception could not be translated"
once `_engine` had been imported. Each order runs in a fresh interpreter.
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
    assert result.stdout.strip() == "['ValueError', 'EngineInputError:True']", result.stdout
