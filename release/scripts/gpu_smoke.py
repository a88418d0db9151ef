"""GPU smoke check of a built wheel: install it, import both modules, run the wheel's own kernel.

Standard library only (plus numpy when present), so it runs on a GPU machine that has none of
the pipeline's dependencies: `python -m release.scripts.gpu_smoke --wheel W --evidence out.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def _gpu() -> dict[str, str]:
    query = "name,driver_version,pci.bus_id"
    result = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
        capture_output=True, text=True,
    )  # fmt: skip
    name, driver, bus = (part.strip() for part in result.stdout.splitlines()[0].split(","))
    return {"kind": "gpu", "gpu": name, "driver": driver, "pci_bus_id": bus}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--evidence", type=Path, required=True)
    args = parser.parse_args()
    digest = hashlib.sha256(args.wheel.read_bytes()).hexdigest()
    target = Path(tempfile.mkdtemp(prefix="activekv-smoke-"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--target", str(target), str(args.wheel)],
        check=True,
    )  # fmt: skip
    sys.path.insert(0, str(target))
    import activekv._engine as engine
    import activekv._fabric as fabric
    import numpy as np

    words = np.arange(1 << 26, dtype=np.uint32)  # 256 MiB through the wheel's kernel
    expected = int(words.astype(np.uint64).sum())
    got = engine.cuda_checksum(words)
    figures = {
        "engine_build_info": engine.build_info(),
        "fabric_build_info": fabric.build_info(),
        "cuda_device_count": engine.cuda_device_count(),
        "checksum_words": int(words.size),
        "checksum_expected": expected,
        "checksum_got": int(got),
        "engine_module": engine.__file__,
    }
    verdict = "pass" if got == expected and figures["cuda_device_count"] > 0 else "fail"
    record = {
        "schema": "activekv.evidence/v1",
        "gate": "gpu-smoke",
        "verdict": verdict,
        "artefacts": {args.wheel.name: digest},
        "figures": figures,
        "runner": _gpu(),
        "tools": {"python": sys.version.split()[0], "numpy": np.__version__},
        "time": datetime.now(timezone.utc).isoformat(),
        "reason": "" if verdict == "pass" else "checksum mismatch or no device",
    }
    args.evidence.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(json.dumps(record, indent=2, sort_keys=True))
    return 0 if verdict == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
