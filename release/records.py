"""Small JSON records the steps leave under `<out>/` for the next step and the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from release.atomic import atomic_write
from release.errors import ReleaseError

# The GPU staging benchmark's record (`python -m release gpu-staging`, read by the report).
GPU_STAGING_RECORD = "gpu-staging"


def write_record(out_dir: Path, name: str, data: dict[str, Any]) -> Path:
    path = out_dir / f"{name}.json"
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode())
    return path


def read_record(out_dir: Path, name: str, made_by: str) -> dict[str, Any]:
    path = out_dir / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ReleaseError(f"{path}: expected the record of `{made_by}`; run it first") from None
    except json.JSONDecodeError as error:
        raise ReleaseError(f"{path}: expected JSON written by `{made_by}`; {error}") from None
